"""llmgw:admin answered in process by a real control plane over its SQLite store: two
nodes as the registry holds them (one Ready with a card and a replica, one NotReady),
a model served through the catalog's own workflow, and the agent's log request
answered by a stand-in session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.jsonvalue import JSON
from llmgw.server.app import ControlPlane
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.mcp.admintools import MAX_LINE_CHARS
from llmgw.server.mcp.tools import ADMIN_SERVER, BuiltinServer, ToolResult
from llmgw.server.principal import Principal
from llmgw.server.requests import ServeRequest
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.messages import EngineInfo, ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support.agentsession import FakeSession, ok
from tests.support.inprocessplane import fresh_data_dir, loaded_plane

GIB = 2**30
REPLICA = "tiny.default.0a1b2c3d"


def log_lines(args: dict[str, Any]) -> list[Any]:
    """What an agent answers: the last ``n`` lines of the log asked for."""
    lines = [f"{args['source']} line {i}" for i in range(1000)]
    lines[-1] = "x" * (MAX_LINE_CHARS + 50)
    return [ok(lines[-args["n"] :])]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Made outside the event loop: ``server init`` runs its own."""
    return fresh_data_dir(tmp_path)[0]


@pytest.fixture
async def plane(data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with loaded_plane(data_dir) as cp:
        facts = HostFacts(
            hostname="gpu1.example",
            os="Debian GNU/Linux 12 (bookworm)",
            arch="x86_64",
            cpu_count=64,
            memory_total=512 * GIB,
            memory_available=400 * GIB,
            gpus=[GPU(index=0, uuid="GPU-1", name="NVIDIA H100 80GB HBM3", memory_total=80 * GIB)],
        )
        ready = NodeView(id="gpu1", cert_serial=1, state=NodeState.READY, facts=facts)
        ready.labels = {"rack": "r1"}
        ready.engines, ready.engines_probed = [EngineInfo("llama.cpp", "/x")], True
        ready.session = FakeSession(logs=log_lines)
        ready.shards[REPLICA] = ShardStatus(
            replica_id=REPLICA, state=ShardState.READY, engine="llama.cpp", port=41000
        )
        lost = NodeView(id="gpu2", cert_serial=2, reason="missed 3 heartbeats")
        cp.registry.nodes.update({"gpu1": ready, "gpu2": lost})
        await cp.models.serve(
            ServeRequest(source="/models/tiny.gguf", name="tiny", memory=GIB),
            Principal.system("test"),
        )
        yield cp


def structured(result: ToolResult) -> dict[str, Any]:
    """The answer's structured content, checked to be what its text block says."""
    assert not result.is_error, result.content
    assert isinstance(result.structured, dict)
    (block,) = result.content
    assert isinstance(block, dict) and block["type"] == "text"
    assert isinstance(block["text"], str)
    assert json.loads(block["text"]) == result.structured
    return result.structured


def error_text(result: ToolResult) -> str:
    assert result.is_error and result.structured is None
    (block,) = result.content
    assert isinstance(block, dict) and isinstance(block["text"], str)
    return block["text"]


async def call(cp: ControlPlane, tool: str, **arguments: JSON) -> ToolResult:
    return await cp.admin_tools.call(tool, arguments)


async def test_its_tools_declare_their_arguments(plane: ControlPlane) -> None:
    tools: BuiltinServer = plane.admin_tools
    assert tools.name == ADMIN_SERVER == "llmgw:admin"
    listed = {t.name: t.input_schema for t in tools.tools()}
    assert sorted(listed) == [
        "cluster_status",
        "explain_placement",
        "list_models",
        "list_nodes",
        "list_replicas",
        "node_logs",
    ]
    for schema in listed.values():
        assert isinstance(schema, dict) and schema["type"] == "object"
        assert schema["additionalProperties"] is False
    explain, logs = listed["explain_placement"], listed["node_logs"]
    assert isinstance(explain, dict) and explain["required"] == ["model"]
    assert isinstance(logs, dict) and logs["required"] == ["node"]


async def test_cluster_status_counts_what_the_registry_and_catalog_hold(
    plane: ControlPlane,
) -> None:
    got = structured(await call(plane, "cluster_status"))
    assert got["nodes"] == {"total": 2, "ready": 1}
    assert got["replicas"] == {"total": 1, "ready": 1}
    assert sum(got["models"].values()) == 1
    assert got["plane"]["leader"] is plane.leader.leading
    assert got["plane"]["serving"] == "serving"
    assert got["plane"]["store_writable"] is True
    assert got["plane"]["store_problem"] is None
    await plane.serving.set(True, Principal.system("test"))
    assert structured(await call(plane, "cluster_status"))["plane"]["serving"] == "stopped"


async def test_list_nodes_shows_state_cards_memory_labels_and_what_each_serves(
    plane: ControlPlane,
) -> None:
    nodes = {n["id"]: n for n in structured(await call(plane, "list_nodes"))["nodes"]}
    assert sorted(nodes) == ["gpu1", "gpu2"]
    gpu1, gpu2 = nodes["gpu1"], nodes["gpu2"]
    assert gpu1["state"] == "Ready" and gpu1["connected"] is True
    assert gpu1["cards"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total": 80 * GIB, "memory_used": None}
    ]
    assert (gpu1["memory_total"], gpu1["memory_available"]) == (512 * GIB, 400 * GIB)
    assert gpu1["labels"] == {"rack": "r1"}
    assert gpu1["serves"] == [{"replica": REPLICA, "model": "tiny", "state": "ready"}]
    # Never read is absent, not zero.
    assert gpu2["state"] == "NotReady" and gpu2["reason"] == "missed 3 heartbeats"
    assert gpu2["cards"] == [] and gpu2["memory_total"] is None
    assert gpu2["connected"] is False and gpu2["serves"] == []


async def test_list_models_and_replicas(plane: ControlPlane) -> None:
    (model,) = structured(await call(plane, "list_models"))["models"]
    assert model["name"] == "tiny" and model["engine"] == "llama.cpp"
    assert model["source"] == "/models/tiny.gguf"
    (replica,) = structured(await call(plane, "list_replicas"))["replicas"]
    assert replica["replica"] == REPLICA and replica["node"] == "gpu1"
    assert (replica["model"], replica["profile"], replica["state"]) == ("tiny", "default", "ready")
    # The engine's port is the gateway's business, not an agent's.
    assert "port" not in replica and "pid" not in replica
    assert structured(await call(plane, "list_replicas", model="tiny"))["replicas"] == [replica]
    assert structured(await call(plane, "list_replicas", model="other"))["replicas"] == []


async def test_explain_placement_gives_every_nodes_verdict(plane: ControlPlane) -> None:
    got = structured(await call(plane, "explain_placement", model="tiny"))
    assert got["model"] == "tiny" and got["verdicts_left_out"] == {"default": 0}
    (profile,) = got["profiles"]
    assert profile["profile"] == "default" and profile["memory"] > 0
    assert profile == {
        **plane.models.explain(plane.models.find("tiny"))[0],
        "verdicts": profile["verdicts"],
    }
    assert {v["node"] for v in profile["verdicts"]} == {"gpu1", "gpu2"}
    assert "no model 'nope'" in error_text(await call(plane, "explain_placement", model="nope"))


async def test_node_logs_reads_once_bounded(plane: ControlPlane) -> None:
    got = structured(await call(plane, "node_logs", node="gpu1", lines=3))
    assert got["node"] == "gpu1" and got["source"] == "agent"
    assert got["lines"][:2] == ["agent line 997", "agent line 998"]
    assert got["lines"][2] == "x" * MAX_LINE_CHARS and got["cut_lines"] == 1
    session = plane.registry.nodes["gpu1"].session
    assert isinstance(session, FakeSession)
    assert session.asked[-1][:2] == ("logs", {"source": "agent", "n": 3, "follow": False})
    got = structured(await call(plane, "node_logs", node="gpu1", replica=REPLICA))
    assert len(got["lines"]) == 100 and got["lines"][0] == f"{REPLICA} line 900"
    assert "cut_lines" in got
    assert "gpu2' is not connected" in error_text(await call(plane, "node_logs", node="gpu2"))
    assert "no node 'gpu9'" in error_text(await call(plane, "node_logs", node="gpu9"))


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("node_logs", {}, "node_logs needs the argument 'node'"),
        ("node_logs", {"node": "gpu1", "lines": 501}, "is from 1 to 500, not 501"),
        ("node_logs", {"node": "gpu1", "lines": 0}, "is from 1 to 500, not 0"),
        ("node_logs", {"node": "gpu1", "lines": True}, "'lines' is a whole number, not true"),
        ("node_logs", {"node": "gpu1", "lines": "9"}, "'lines' is a whole number, not \"9\""),
        ("node_logs", {"node": "../etc"}, "'node' must match"),
        ("node_logs", {"node": "gpu1", "replica": "a/b"}, "'replica' must match"),
        ("explain_placement", {"model": 7}, "'model' is a string, not 7"),
        ("explain_placement", {"model": "m" * 257}, "at most 256 characters"),
        (
            "list_nodes",
            {"verbose": True},
            "list_nodes takes no argument 'verbose' (it takes: none)",
        ),
        ("cluster_status", {"x": 1}, "takes no argument 'x'"),
        ("drop_tables", {}, "llmgw:admin has no tool 'drop_tables'; its tools: cluster_status"),
    ],
)
async def test_bad_arguments_are_an_error_answer_naming_them(
    plane: ControlPlane, tool: str, arguments: dict[str, JSON], says: str
) -> None:
    session = plane.registry.nodes["gpu1"].session
    assert isinstance(session, FakeSession)
    before = len(session.asked)
    assert says in error_text(await plane.admin_tools.call(tool, arguments))
    # Checked before anything is asked of a node.
    assert session.asked[before:] == []
