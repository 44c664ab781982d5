"""What `ctl models`, `ctl model show` and `ctl explain` print, and their size parser."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from llmgw.client.ctl_models import explain_text, model_text, models_table, parse_size

GIB = 1024**3


def model_json(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "qwen",
        "source": "hf:Qwen/Qwen3-8B-GGUF:Q4_K_M",
        "engine": "llama.cpp",
        "state": "degraded",
        "replicas": 3,
        "desired": 3,
        "ready": 2,
        "starting": 0,
        "stale": 0,
        "context": 8192,
        "slots": 2,
        "max_output": 1024,
        "on_demand": False,
        "stopped": False,
        "parked": None,
        "weight_bytes": 5 * GIB,
        "shape": {"architecture": "qwen3", "parameters": 8_190_000_000, "layers": 36},
        "profiles": [
            {
                "name": "gpu",
                "engine": "llama.cpp",
                "args": ["--jinja"],
                "cards": 1,
                "card_memory": 7 * GIB,
                "memory": GIB,
                "cpu_cores": 0,
                "replicas": 2,
                "priority": 0,
                "selector": {},
                "status": {"ready": 2, "note": ""},
            },
            {
                "name": "cpu",
                "engine": "llama.cpp",
                "args": [],
                "cards": 0,
                "card_memory": 0,
                "memory": 7 * GIB,
                "cpu_cores": 8,
                "replicas": 1,
                "priority": -1,
                "selector": {"zone": "b"},
                "cpu_tokens_per_second": 14.2,
                "status": {"ready": 0, "note": "no node fits (memory: 3 nodes)"},
            },
        ],
    }
    return {**base, **kw}


def test_models_table_shows_counts_per_profile_and_why_short() -> None:
    lines = models_table([model_json()]).splitlines()
    assert lines[0].split() == ["NAME", "STATE", "READY", "ENGINE", "CONTEXT", "PROFILES", "NOTE"]
    assert lines[1].split()[:5] == ["qwen", "degraded", "2/3", "llama.cpp", "8192"]
    assert "gpu 2/2 (1 card), cpu 0/1" in lines[1]
    assert lines[1].endswith("no node fits (memory: 3 nodes)")
    assert "llmgw ctl model serve" in models_table([])


def test_model_text_says_shape_profiles_and_figures_in_binary_units() -> None:
    text = model_text(model_json())
    assert "qwen: degraded, 2 of 3 ready" in text
    assert "8192 tokens x 2 slot(s), longest answer 1024" in text
    assert "qwen3, 8.19B parameters, 36 layers, 5.0 GiB of weights" in text
    assert "gpu: 2/2 ready, llama.cpp on 1 card(s), 7.0 GiB each, 1.0 GiB memory" in text
    assert (
        "cpu: 0/1 ready, llama.cpp on CPU, 7.0 GiB memory, 8 cores, priority -1, "
        "~14.2 tokens/s a reply" in text
    )
    assert "on nodes with: zone=b" in text and "args: --jinja" in text


def test_model_text_says_whether_it_takes_images_and_which_urls() -> None:
    assert "images:" not in model_text(model_json())
    assert "images:" not in model_text(model_json(vision=False, allow_image_urls=True))
    said = model_text(model_json(vision=True))
    assert "images:      takes images in chat requests (data: URLs)" in said
    fetched = model_text(model_json(vision=True, allow_image_urls=True))
    assert "(data: and http(s) URLs)" in fetched


def test_explain_text_ranks_fitting_nodes_first() -> None:
    verdicts = [
        {
            "node": "b",
            "ok": False,
            "reasons": ["memory: needs 7.0 GiB, 2.0 GiB free"],
            "notes": [],
            "rank": None,
            "cards": [],
        },
        {"node": "c", "ok": True, "reasons": [], "notes": [], "rank": 2, "cards": []},
        {
            "node": "a",
            "ok": True,
            "reasons": [],
            "notes": ["disk: weights already here"],
            "rank": 1,
            "cards": ["GPU-1"],
        },
    ]
    profile = {
        "model": "qwen",
        "profile": "gpu",
        "engine": "llama.cpp",
        "desired": 2,
        "memory": GIB,
        "cards": 1,
        "card_memory": 7 * GIB,
        "cpu_cores": 0,
        "disk": 5 * GIB,
        "running_on": ["a"],
        "note": "",
        "avoid": ["c"],
        "verdicts": verdicts,
    }
    lines = explain_text([profile]).splitlines()
    assert lines[0].startswith("qwen / gpu (llama.cpp): 2 wanted, running on a")
    assert "1 card(s) with 7.0 GiB free" in lines[0]
    assert lines[1] == "  failed recently on: c"
    nodes = [line.split()[0] for line in lines[3:]]
    assert nodes == ["a", "c", "b"]
    assert "fits (#1)" in lines[3] and "GPU-1" in lines[3]
    assert lines[5].endswith("memory: needs 7.0 GiB, 2.0 GiB free")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8GiB", 8 * GIB),
        ("8G", 8 * GIB),
        ("512MiB", 512 * 2**20),
        ("1.5T", int(1.5 * 2**40)),
        ("1000", 1000),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_a_size_that_is_not_one_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a size"):
        parse_size("lots")
