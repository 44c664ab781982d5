"""``llmgw sim`` end to end: the fleet brought up by the real reconcile loop, the trace
routed by the real router, and what a node's failure or a drain does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import main
from llmgw.sim.report import (
    EventJson,
    ModelReportJson,
    PlacementWhyJson,
    ReplicaJson,
    SimReportJson,
)
from tests.sim.conftest import FIXTURES, MODELS, Write, steady
from tests.sim.conftest import trace as trace_of


def sim(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict[str, Any]:
    assert main(["sim", *map(str, args), "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def inputs(write: Write, seconds: float = 600.0) -> tuple[Path, Path]:
    return write("models.yaml", MODELS), write(
        "trace.jsonl", steady(["llama-8b", "llama-70b"], seconds, 2.0)
    )


def by_model(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in report["models"]}


def test_the_json_is_one_object_of_the_documented_fields(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    models, trace = inputs(write)
    report = sim(
        capsys, "--nodes", "4x8xH100", "--models", models, "--load", trace, "--fail", "node=gpu1@2m"
    )
    assert set(report) == set(SimReportJson.__annotations__)
    for m in report["models"]:
        assert set(m) == set(ModelReportJson.__annotations__)
        assert set(m["placement"]) == set(PlacementWhyJson.__annotations__)
    for r in report["replicas"]:
        assert set(r) == set(ReplicaJson.__annotations__)
    (event,) = report["events"]
    assert set(event) == set(EventJson.__annotations__)
    assert report["nodes"] == 4 and report["cards"] == 32
    assert report["requests"] == 600


def test_every_replica_is_placed_and_serves(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    models, trace = inputs(write)
    report = sim(capsys, "--nodes", "4x8xH100", "--models", models, "--load", trace)
    for name, wanted, cards in (("llama-8b", 3, 1), ("llama-70b", 2, 4)):
        m = by_model(report)[name]
        assert m["replicas_ready"] == wanted
        assert m["placement"]["nodes_fit"] == 4 and m["placement"]["refused"] == {}
        assert m["requests"] == m["served"] == 300 and m["failed"] == {}
        assert m["ttft_p50"] is not None and 0 < m["ttft_p50"] <= m["ttft_p95"] <= m["ttft_max"]
        assert m["joules_per_token"] is not None and m["joules_per_token"] > 0
        mine = [r for r in report["replicas"] if r["model"] == name]
        assert len(mine) == wanted and all(len(r["cards"]) == cards for r in mine)
    # No card is given to two replicas of cards that would not fit it twice.
    big = [c for r in report["replicas"] if r["model"] == "llama-70b" for c in r["cards"]]
    assert len(big) == len(set(big))
    assert report["bring_up_seconds"] > 0 and report["events"] == []


def test_a_node_failure_moves_its_replicas_and_says_what_it_cost(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    models, trace = inputs(write)
    calm = sim(capsys, "--nodes", "4x8xH100", "--models", models, "--load", trace)
    first = {r["replica"]: r["node"] for r in calm["replicas"]}
    victim = next(r["node"] for r in calm["replicas"] if r["model"] == "llama-70b")
    report = sim(
        capsys,
        "--nodes",
        "4x8xH100",
        "--models",
        models,
        "--load",
        trace,
        "--fail",
        f"node={victim}@2m",
    )
    (event,) = report["events"]
    assert event["kind"] == "node" and event["node"] == victim and event["at"] == 120.0
    lost = [r for r in report["replicas"] if r["replica"] in event["replicas"]]
    assert lost and all(r["stopped_at"] == 120.0 for r in lost)
    assert all(f"its node {victim} failed" == r["stop_reason"] for r in lost)
    assert len(event["moved_to"]) == len(lost)
    assert all(r["node"] != victim for r in event["moved_to"])
    assert sorted(r["why"].split(":")[0] for r in event["moved_to"]) == sorted(
        f"in place of {r['replica']}" for r in lost
    )
    assert all(r["why"].endswith(f"its node {victim} failed") for r in event["moved_to"])
    # Placed elsewhere only once the node is lost past its grace (60 s).
    assert all(r["started_at"] >= 180.0 for r in event["moved_to"])
    assert event["recovered_at"] is not None and event["recovered_at"] > 180.0
    assert event["failed_until_recovered"] is not None
    assert len(first) == len(calm["replicas"])  # the calm run moved nothing
    hit = {r["model"] for r in lost}
    for name in hit:
        m = by_model(report)[name]
        if all(r["node"] == victim for r in calm["replicas"] if r["model"] == name):
            # Every replica of it was there: its requests failed until the new were Ready.
            assert m["failed"].get("no_replica", 0) > 0
        assert m["replicas_ready"] == by_model(calm)[name]["replicas_ready"]


def test_a_failure_with_no_room_left_queues_then_refuses(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two nodes of one L4, a replica each (two do not fit one card), one request at a
    # time: each reply takes about 35 s, one arrives every 25 s, so one alone falls behind.
    single = {**MODELS[0], "replicas": 2, "slots": 1}
    models = write("models.yaml", [single])
    trace = write("trace.jsonl", trace_of([(t * 25.0, "llama-8b", 2000, 400) for t in range(200)]))
    calm = sim(capsys, "--nodes", "2x1xL4", "--models", models, "--load", trace)
    assert {r["node"] for r in calm["replicas"]} == {"gpu1", "gpu2"}
    assert by_model(calm)["llama-8b"]["failed"] == {}
    report = sim(
        capsys, "--nodes", "2x1xL4", "--models", models, "--load", trace, "--fail", "node=gpu1@5m"
    )
    (event,) = report["events"]
    assert event["moved_to"] == [] and event["recovered_at"] is None
    m = by_model(report)["llama-8b"]
    assert m["note"].startswith("no node fits")
    assert m["replicas_ready"] == 1
    assert event["queued_until_recovered"] > 0
    assert m["failed"].get("queue_timeout", 0) > 0
    assert event["failed_until_recovered"] == sum(m["failed"].values()) + m["interrupted"]
    assert m["queue_wait_p95"] > by_model(calm)["llama-8b"]["queue_wait_p95"]


def test_a_drain_moves_replicas_before_stopping_them(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    models, trace = inputs(write)
    calm = sim(capsys, "--nodes", "4x8xH100", "--models", models, "--load", trace)
    node = next(r["node"] for r in calm["replicas"] if r["model"] == "llama-8b")
    report = sim(
        capsys,
        "--nodes",
        "4x8xH100",
        "--models",
        models,
        "--load",
        trace,
        "--fail",
        f"drain={node}@1m",
    )
    (event,) = report["events"]
    assert event["kind"] == "drain" and event["replicas"]
    assert len(event["moved_to"]) == len(event["replicas"])
    assert all(r["node"] != node for r in event["moved_to"])
    old = [r for r in report["replicas"] if r["replica"] in event["replicas"]]
    assert all(r["stop_reason"] == "its node is draining" for r in old)
    assert all(r["why"].endswith("was drained") for r in event["moved_to"])
    # Each old replica served until one in its place was Ready: nothing failed.
    ready = sorted(r["ready_at"] for r in event["moved_to"])
    assert min(r["stopped_at"] for r in old) >= ready[0]
    for m in report["models"]:
        assert m["failed"] == {} and m["interrupted"] == 0
    assert event["recovered_at"] is not None and event["failed_until_recovered"] == 0


def test_a_replica_spanning_nodes_moves_whole_and_a_long_fetch_is_no_hang(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    # 700 GiB at 1.25 GB/s: past the 600 s start timeout, progress reported all along.
    huge = {
        **MODELS[1],
        "name": "huge",
        "gpus": 8,
        "nodes": 2,
        "replicas": 1,
        "shape": {
            **MODELS[1]["shape"],
            "file_bytes": "700GiB",  # type: ignore[dict-item]
            "parameters": 405_000_000_000,
            "layers": 126,
        },
    }
    models = write("models.yaml", [huge])
    trace = write("trace.jsonl", steady(["huge"], 300, 10.0))
    report = sim(
        capsys, "--nodes", "4x8xH100", "--models", models, "--load", trace, "--fail", "node=gpu2@1m"
    )
    first, *rest = report["replicas"]
    assert first["node"] == "gpu1" and first["workers"] == ["gpu2"]
    assert len(first["cards"]) == 8
    assert first["stop_reason"] == "its node gpu2 failed"
    assert report["bring_up_seconds"] > 600  # one fetch, never stopped as hung
    (event,) = report["events"]
    (moved,) = event["moved_to"]
    assert {moved["node"], *moved["workers"]} == {"gpu3", "gpu4"}
    assert moved["stopped_at"] is None and moved["ready_at"] > 600


def test_a_recorded_fleet_places_by_its_labels_and_cards(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    zoned = {**MODELS[1], "replicas": 1, "selector": {"zone": "b"}}
    models = write("models.yaml", [MODELS[0], zoned])
    trace = write("trace.jsonl", steady(["llama-8b"], 10, 5.0))
    report = sim(capsys, "--fleet", FIXTURES / "nodes.json", "--models", models, "--load", trace)
    (big,) = [r for r in report["replicas"] if r["model"] == "llama-70b"]
    assert big["node"] == "h100-b"
    why = by_model(report)["llama-70b"]["placement"]
    assert why["nodes_fit"] == 1 and why["refused"] == {"selector": 2, "engine": 1}
    assert "zone=b wanted" in why["examples"]["selector"]


def test_text_says_where_each_replica_went(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    models, trace = inputs(write, 60.0)
    assert (
        main(
            [
                "sim",
                "--nodes",
                "2x8xH100",
                "--models",
                str(models),
                "--load",
                str(trace),
                "--fail",
                "node=gpu1@30s",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for line in ("llama-8b.default.", "llama-70b.default."):
        assert line in out
    assert "2 nodes, 16 cards, binpack" in out
    assert "gpu1 failed at 30 s" in out
    assert "first token p50" in out and "J a token" in out


def test_a_model_that_fits_nowhere_is_refused_as_serve_refuses_it(
    write: Write, capsys: pytest.CaptureFixture[str]
) -> None:
    zoned = {**MODELS[0], "selector": {"zone": "b"}}
    models = write("models.yaml", [zoned])
    trace = write("trace.jsonl", steady(["llama-8b"], 10, 5.0))
    assert main(["sim", "--nodes", "3x8xH100", "--models", str(models), "--load", str(trace)]) == 1
    err = capsys.readouterr().err
    assert "llama-8b fits no node even with nothing else running" in err
    assert "selector: 3 node(s)" in err and "zone=b wanted" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--nodes", "4x8xH900"], "unknown card type 'H900'"),
        (["--nodes", "4x8xH100", "--fail", "gpu1"], "--fail 'gpu1': give node=NAME@WHEN"),
        (["--nodes", "4x8xH100", "--fail", "node=gpu9@1m"], "no node 'gpu9' in the fleet"),
        (["--nodes", "4x8xH100", "--fetch-gbs", "0"], "--fetch-gbs"),
        (
            ["--nodes", "4x8xH100", "--duration", "5m", "--fail", "node=gpu1@5m"],
            "--fail node=gpu1@300s: past --duration 300s",
        ),
    ],
)
def test_bad_arguments_are_said_plainly(
    write: Write, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    models, trace = inputs(write, 10.0)
    assert main(["sim", *args, "--models", str(models), "--load", str(trace)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llmgw: ") and said in err
