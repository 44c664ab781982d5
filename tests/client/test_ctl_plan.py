"""``ctl model plan``: the parser, the query it sends, and the report it prints."""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from llmgw.client import ctl_plan
from llmgw.client.admin import AdminClient
from llmgw.client.ctl_plan import add_plan_parser, plan_query, plan_text
from llmgw.client.routes import PLAN
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
        + ["--nodes", "2"]
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
        "nodes": "2",
    }
    # Not asked: not sent, so an older control plane is asked as before.
    assert "nodes" not in plan_query(parser().parse_args(["plan", "hf:org/m:Q4_K_M"]))


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


def card8(uuid: str, used: float = 0) -> dict[str, Any]:
    return {
        "index": 0,
        "uuid": uuid,
        "name": "C",
        "memory_total": 8 * GiB,
        "memory_used": int(used * GiB),
    }


SPAN_NODES = [
    plan_node("a", memory_available=16 * GiB, gpus=[card8("A0")]),  # type: ignore[list-item]
    plan_node("b", memory_available=16 * GiB, gpus=[card8("B0")]),  # type: ignore[list-item]
]


def test_a_replica_spanning_nodes_is_reported_share_by_share_and_set_by_set() -> None:
    text = plan_text(plan(MODEL, SPAN_NODES, context=4096, nodes_per_replica=2))
    assert "x 1 slot(s), spanning 2 nodes (layers split over them)" in text
    assert "  on 2 cards, 1 on each node (layer split): " in text
    assert "  on the CPUs: " in text and "of host memory, one share a node" in text
    assert "One replica spans 2 nodes; the sets it could go to, best first:" in text
    assert "  nodes without InfiniBand: fits on a, b; no InfiniBand between these nodes" in text
    assert text.rstrip().endswith("Fits now on: a, b (one replica across them)")

    short = plan_text(plan(MODEL, SPAN_NODES, context=4096, nodes_per_replica=3))
    assert "  nodes without InfiniBand: no: 2 node(s) fit, 3 needed (a, b)" in short
    assert "Fits now on: no set of 3 nodes (reasons above)" in short
    assert "warning: no set of 3 nodes joined by one wire" in short


def test_the_command_sends_nodes_and_prints_the_spanning_plan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = plan(MODEL, SPAN_NODES, context=4096, nodes_per_replica=2)
    asked: list[str] = []

    class Client(AdminClient):
        def request(self, method: str, path: str, body: Any = None) -> Any:
            asked.append(path)
            return answer

    monkeypatch.setattr("llmgw.client.admin.resolve", lambda *a: Client("http://cp", "t"))
    args = parser().parse_args(["plan", "hf:org/test:Q8_0", "--nodes", "2", "--json"])
    assert args.handler(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["replica_nodes"] == 2 and shown["fits_on"] == ["a", "b"]
    assert shown["spans"][0]["chosen"] == ["a", "b"]
    assert parse_qs(urlsplit(asked[0]).query)["nodes"] == ["2"]
    args = parser().parse_args(["plan", "hf:org/test:Q8_0", "--nodes", "2"])
    assert args.handler(args) == 0
    assert "Fits now on: a, b (one replica across them)" in capsys.readouterr().out
