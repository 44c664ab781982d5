"""Inputs for the ``llmgw sim`` tests: a models file and a trace, written per test."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sim"

LLAMA_8B = {
    "architecture": "llama",
    "parameters": 8_030_000_000,
    "file_bytes": "15GiB",
    "layers": 32,
    "embedding": 4096,
    "heads": 32,
    "kv_heads": 8,
    "head_size": 128,
    "trained_context": 131072,
}
LLAMA_70B = {
    **LLAMA_8B,
    "parameters": 70_600_000_000,
    "file_bytes": "131GiB",
    "layers": 80,
    "embedding": 8192,
    "heads": 64,
}
MODELS = [
    {
        "source": "hf:meta-llama/Llama-3.1-8B-Instruct",
        "name": "llama-8b",
        "engine": "vllm",
        "gpus": 1,
        "replicas": 3,
        "slots": 8,
        "context": 8192,
        "shape": LLAMA_8B,
    },
    {
        "source": "hf:meta-llama/Llama-3.1-70B-Instruct",
        "name": "llama-70b",
        "engine": "vllm",
        "gpus": 4,
        "replicas": 2,
        "slots": 16,
        "context": 8192,
        "shape": LLAMA_70B,
    },
]

Write = Callable[[str, object], Path]


@pytest.fixture
def write(tmp_path: Path) -> Write:
    """A file of ``tmp_path``: text as given, anything else as JSON (YAML reads it)."""

    def _write(name: str, content: object) -> Path:
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return _write


def trace(requests: Sequence[tuple[float, str, int, int]]) -> str:
    return "".join(
        json.dumps({"at": at, "model": m, "prompt_tokens": p, "output_tokens": o}) + "\n"
        for at, m, p, o in requests
    )


def steady(models: Sequence[str], seconds: float, every: float) -> str:
    """A request of each model every ``every`` seconds for ``seconds``."""
    out = []
    t = 0.0
    while t < seconds:
        out += [(t, m, 500, 100) for m in models]
        t += every
    return trace(out)
