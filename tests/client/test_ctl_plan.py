"""``ctl model plan``: the parser, the query it sends, and the report it prints."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from llmgw.client import ctl_plan
from llmgw.client.admin import PLAN, AdminClient
from llmgw.client.ctl_plan import add_plan_parser, plan_query, plan_text
from llmgw.modelkit.sizing import GiB
from llmgw.server.catalog.plan import plan
from tests.support.plannodes import MODEL, plan_node

NODES = [
    plan_node(
        "gpu1",
        memory_available=64 * GiB,
        gpus=[{"index": 0, "uuid": "G0", "name": "C", "memory_total": 24 * GiB, "memory_used": 0}],
    ),
    plan_node("slow", memory_available=32 * GiB, memory_read_gbs=1.0, memory_read_one_core_gbs=1.0),
    plan_node("tiny", memory_available=GiB),
]


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="llmgw ctl model")
    sub = root.add_subparsers(dest="model_command")
    add_plan_parser(sub)
    return root


def test_query_carries_every_option() -> None:
    args = parser().parse_args(
        ["plan", "hf:org/m:Q4_K_M", "--context", "4096", "--slots", "2", "--gpus", "1"]
        + ["--engine", "llama.cpp", "--allow-pickle", "--cpu-cores", "8", "--json"]
    )
    assert args.handler is ctl_plan.cmd_model_plan
    url = urlsplit(PLAN.at(query=plan_query(args)))
    assert url.path == "/api/v1/plan"
    assert {k: v[0] for k, v in parse_qs(url.query).items()} == {
        "source": "hf:org/m:Q4_K_M",
        "context": "4096",
        "slots": "2",
        "gpus": "1",
        "cpu_cores": "8",
        "engine": "llama.cpp",
        "allow_pickle": "true",
    }


def test_report_names_memory_verdicts_and_speed() -> None:
    text = plan_text(plan(MODEL, NODES, context=None))
    assert "hf:org/test:Q8_0  (gguf, 8.0 GiB)" in text
    assert "KV heads:" in text and "32 / 8" in text
    assert "context 8,192 (trained)" in text
    assert "weights 8.0 GiB + KV cache 1.0 GiB" in text
    assert "fits on card 0" in text
    assert "fits on the CPU" in text
    assert "no: on cards: no cards; on the CPU: memory: needs" in text
    assert "Fits now on: gpu1, slow" in text
    assert "warning: slow: on the CPU, a reply of 500 tokens would take about" in text


def test_command_prints_json_or_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = plan(MODEL, NODES, context=2048)
    asked: list[str] = []

    class Client(AdminClient):
        def request(self, method: str, path: str, body: Any = None) -> Any:
            asked.append(path)
            return answer

    monkeypatch.setattr("llmgw.client.admin.resolve", lambda *a: Client("http://cp", "t"))
    args = parser().parse_args(["plan", "/models/x.gguf", "--json"])
    assert args.handler(args) == 0
    assert json.loads(capsys.readouterr().out) == answer
    args = parser().parse_args(["plan", "/models/x.gguf"])
    assert args.handler(args) == 0
    assert "Fits now on:" in capsys.readouterr().out
    assert asked[0].startswith("/api/v1/plan?source=%2Fmodels%2Fx.gguf")
