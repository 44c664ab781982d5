"""``FleetService`` over a real registry and SQLite store, with fake agent sessions: a
node never enrolled is 404 and one not connected 409 with its reason; shards started by
hand carry the engine key derived from the cluster secret and are audited; logs once
and followed; the weights cache listed with what is wanted, and collected of only what
no shard uses; a node's marks; and ``shard_rows``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmgw import pki
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.service import FleetService, shard_rows
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import LabelsRequest, LogsQuery, StartShardRequest
from llmgw.server.store import SQLiteStore
from llmgw.wire.messages import AdapterSpec, Compute, ShardStatus, ShardUsage, StartShard, StopShard
from llmgw.wire.states import NodeState, ShardState
from tests.support import wiring
from tests.support.agentsession import Answers, FakeSession, failed, ok

SECRET = b"cluster secret of the test"
CAROL = Principal("carol@10.0.0.7", "operator", "session")


@dataclass
class Fleet:
    service: FleetService
    registry: NodeRegistry
    store: SQLiteStore

    async def node(self, node_id: str, session: FakeSession | None = None) -> NodeView:
        """An enrolled node, connected through ``session`` when one is given."""
        await self.registry.enrolled(node_id, 1)
        view = self.registry.nodes[node_id]
        if session is not None:
            view.session = session
            view.state, view.reason = NodeState.READY, ""
        return view

    async def audit(self) -> list[tuple[str, str, str, str]]:
        """The audit log, oldest first."""
        entries = await self.store.audit_log()
        return [(e["actor"], e["action"], e["target"], e["detail"]) for e in reversed(entries)]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    registry = wiring.registry(store)
    try:
        yield Fleet(FleetService(registry, SECRET), registry, store)
    finally:
        await store.close()


def running(replica_id: str, source: str, **kw: Any) -> ShardStatus:
    return ShardStatus(replica_id=replica_id, state=ShardState.READY, source=source, **kw)


# ------------------------------------------------------------------ which node


async def test_a_node_never_enrolled_is_404_and_one_not_connected_409_with_its_reason(
    fleet: Fleet,
) -> None:
    with pytest.raises(Refusal) as refused:
        fleet.service.node("ghost")
    assert refused.value.status == 404 and "no node 'ghost'" in refused.value.message

    view = await fleet.node("n1")
    view.reason = "missed 3 heartbeats"
    with pytest.raises(Refusal) as refused:
        fleet.service.connected("n1")
    assert (refused.value.status, refused.value.code) == (409, "node_unavailable")
    assert refused.value.message == (
        "node 'n1' is not connected now (NotReady: missed 3 heartbeats)"
    )
    view.reason = ""
    with pytest.raises(Refusal) as refused:
        fleet.service.connected("n1")
    assert refused.value.message.endswith("(NotReady)")

    session = FakeSession()
    view.session = session
    assert fleet.service.connected("n1") == (view, session)


async def test_nodes_are_listed_by_id(fleet: Fleet) -> None:
    for node_id in ("b", "c", "a"):
        await fleet.node(node_id)
    assert [v.id for v in fleet.service.nodes()] == ["a", "b", "c"]


async def test_a_node_not_heard_from_has_empty_history(fleet: Fleet) -> None:
    await fleet.node("n1")
    history = fleet.service.history("n1", 5)
    assert history["node"] == "n1" and history["t"] == [] and history["gpus"] == []
    assert history["step_seconds"] == fleet.registry.history.step
    with pytest.raises(Refusal):
        fleet.service.history("ghost", 5)


# ------------------------------------------------------------------ shards by hand


async def test_a_shard_started_by_hand_carries_the_derived_engine_key_and_is_audited(
    fleet: Fleet,
) -> None:
    session = FakeSession()
    view = await fleet.node("n1", session)
    ask = StartShardRequest(
        replica_id="r-7",
        engine="llama.cpp",
        source="hf:org/repo:Q4_K_M",
        port=9001,
        args=("--ctx-size", "4096"),
        cards=("GPU-0",),
    )
    assert await fleet.service.start_shard("n1", ask, CAROL) is view
    (sent,) = session.sent
    assert isinstance(sent, StartShard)
    spec = sent.spec
    assert spec.key == pki.engine_key(SECRET, "r-7") and spec.key.startswith("llmgw-engine-")
    assert spec.key != pki.engine_key(b"another secret", "r-7")
    assert (spec.replica_id, spec.engine, spec.source, spec.port) == (
        "r-7",
        "llama.cpp",
        "hf:org/repo:Q4_K_M",
        9001,
    )
    assert spec.fingerprint == "direct"  # the reconciler leaves it alone
    assert (spec.args, spec.cards) == (["--ctx-size", "4096"], ["GPU-0"])
    assert await fleet.audit() == [
        ("carol@10.0.0.7", "shard.start", "n1/r-7", "hf:org/repo:Q4_K_M")
    ]


async def test_a_shard_is_stopped_by_hand_and_audited(fleet: Fleet) -> None:
    session = FakeSession()
    await fleet.node("n1", session)
    await fleet.service.stop_shard("n1", "r-7", CAROL)
    assert session.sent == [StopShard(replica_id="r-7")]
    assert await fleet.audit() == [("carol@10.0.0.7", "shard.stop", "n1/r-7", "")]


async def test_nothing_is_sent_nor_audited_for_a_node_not_connected(fleet: Fleet) -> None:
    await fleet.node("n1")
    ask = StartShardRequest(replica_id="r", engine="llama.cpp", source="s", port=9001)
    with pytest.raises(Refusal) as refused:
        await fleet.service.start_shard("n1", ask, CAROL)
    assert refused.value.status == 409
    with pytest.raises(Refusal) as refused:
        await fleet.service.stop_shard("n1", "r", CAROL)
    assert refused.value.status == 409
    assert await fleet.audit() == []


# ------------------------------------------------------------------ logs


async def test_a_log_is_read_once_with_the_lines_asked(fleet: Fleet) -> None:
    session = FakeSession(logs=[ok({"lines": ["a", "b"]}), ok({"lines": ["never read"]})])
    await fleet.node("n1", session)
    result = await fleet.service.logs("n1", LogsQuery(source="r-7", n=2))
    assert result == {"lines": ["a", "b"]}
    assert session.asked == [("logs", {"source": "r-7", "n": 2, "follow": False}, 15.0)]


@pytest.mark.parametrize(
    ("answers", "status", "message"),
    [
        ([failed("no shard r-9 on this node")], 404, "no shard r-9 on this node"),
        ([failed("")], 404, "no such log"),
        ([TimeoutError("no answer in 15 s")], 504, "no answer in 15 s"),
        ([ConnectionError()], 504, "no answer"),
        ([], 504, "no answer"),
    ],
)
async def test_a_log_that_cannot_be_read_says_why(
    fleet: Fleet, answers: Answers, status: int, message: str
) -> None:
    await fleet.node("n1", FakeSession(logs=answers))
    with pytest.raises(Refusal) as refused:
        await fleet.service.logs("n1", LogsQuery(source="r-9"))
    assert (refused.value.status, refused.value.message) == (status, message)


async def test_a_followed_log_yields_each_batch_and_an_error_ends_it(fleet: Fleet) -> None:
    session = FakeSession(
        logs=[
            ok({"lines": ["one"]}, more=True),
            ok({"lines": []}, more=True),
            failed("the shard was stopped"),
            ok({"lines": ["after the end"]}, more=True),
        ]
    )
    await fleet.node("n1", session)
    batches = [b async for b in fleet.service.follow_logs("n1", LogsQuery(n=10))]
    assert batches == [{"lines": ["one"]}, {"lines": []}, {"error": "the shard was stopped"}]
    assert session.asked == [("logs", {"source": "agent", "n": 10, "follow": True}, 60)]


async def test_following_a_node_not_connected_is_refused_before_any_batch(
    fleet: Fleet,
) -> None:
    await fleet.node("n1")
    with pytest.raises(Refusal) as refused:
        fleet.service.follow_logs("n1", LogsQuery())
    assert refused.value.status == 409


# ------------------------------------------------------------------ weights


def cache(*entries: tuple[str, str | None]) -> list[dict[str, Any]]:
    return [{"name": name, "source": source, "bytes": 10} for name, source in entries]


async def test_the_weights_listing_marks_what_a_shard_uses(fleet: Fleet) -> None:
    a = FakeSession(weights_list=lambda args: [ok(cache(("m1", "hf:a"), ("m2", "hf:b")))])
    b = FakeSession(weights_list=[TimeoutError("no answer in 15 s")])
    view_a = await fleet.node("a", a)
    await fleet.node("b", b)
    await fleet.node("c")  # not connected: not asked, not listed
    view_a.shards["r1"] = running("r1", "hf:a")
    listed = await fleet.service.weights(None)
    assert [(e["node"], e.get("name"), e.get("wanted")) for e in listed] == [
        ("a", "m1", True),
        ("a", "m2", False),
        ("b", None, None),
    ]
    assert listed[2]["error"] == "no answer in 15 s"
    assert [e["node"] for e in await fleet.service.weights("a")] == ["a", "a"]
    assert b.kinds() == ["weights.list"]


async def test_a_node_that_fails_to_list_its_weights_says_so(fleet: Fleet) -> None:
    await fleet.node("a", FakeSession(weights_list=[failed("the cache is not mounted")]))
    assert await fleet.service.weights(None) == [{"node": "a", "error": "the cache is not mounted"}]


class Cache:
    """A node's weights cache: lists what it holds, deletes what it is asked to but
    ``stuck`` (a file held open), and says so."""

    def __init__(self, *entries: tuple[str, str | None], stuck: tuple[str, ...] = ()) -> None:
        self.entries = cache(*entries)
        self.stuck = stuck

    def session(self) -> FakeSession:
        return FakeSession(weights_list=self.listing, weights_collect=self.collect)

    def listing(self, args: dict[str, Any]) -> Answers:
        return [ok([dict(e) for e in self.entries])]

    def collect(self, args: dict[str, Any]) -> Answers:
        removed = [n for n in args["names"] if n not in self.stuck]
        kept = [n for n in args["names"] if n in self.stuck]
        self.entries = [e for e in self.entries if e["name"] not in removed]
        return [ok({"removed": removed, "kept": kept, "freed_bytes": 10 * len(removed)})]


async def test_collect_asks_each_node_to_delete_only_what_no_shard_uses(fleet: Fleet) -> None:
    node_a = Cache(("used", "hf:used"), ("old", "hf:old"), ("held", "hf:held"), stuck=("held",))
    node_b = Cache(("lora", "hf:lora"), ("other", "hf:other"))
    a, b = node_a.session(), node_b.session()
    view_a = await fleet.node("a", a)
    await fleet.node("b", b)
    view_a.shards["r1"] = running("r1", "hf:used")
    # A shard on another node keeps its adapter's weights everywhere.
    view_a.shards["r2"] = running(
        "r2", "hf:used", adapters=[AdapterSpec(name="x", source="hf:lora")]
    )

    report = await fleet.service.collect(None, CAROL)
    assert report == [
        {
            "node": "a",
            "asked": ["old", "held"],
            "removed": ["old"],
            "kept": ["held"],
            "freed_bytes": 10,
            "still_listed": ["held"],
        },
        {
            "node": "b",
            "asked": ["other"],
            "removed": ["other"],
            "kept": [],
            "freed_bytes": 10,
            "still_listed": [],
        },
    ]
    assert ("weights.collect", {"names": ["old", "held"]}, 60.0) in a.asked
    assert [e["name"] for e in node_a.entries] == ["used", "held"]
    assert [e["name"] for e in node_b.entries] == ["lora"]
    assert await fleet.audit() == [
        ("carol@10.0.0.7", "weights.collect", "a", "asked 2, removed 1"),
        ("carol@10.0.0.7", "weights.collect", "b", "asked 1, removed 1"),
    ]


async def test_collect_on_one_node_and_a_node_that_fails_is_reported_not_audited(
    fleet: Fleet,
) -> None:
    node_a = Cache(("old", "hf:old"))
    a = node_a.session()
    b = FakeSession(weights_list=[failed("the cache is not mounted")])
    await fleet.node("a", a)
    await fleet.node("b", b)
    assert await fleet.service.collect("b", CAROL) == [
        {"node": "b", "error": "the cache is not mounted"}
    ]
    assert a.asked == [] and b.kinds() == ["weights.list"]
    assert await fleet.audit() == []
    (only_a,) = await fleet.service.collect("a", CAROL)
    assert only_a["removed"] == ["old"] and b.kinds() == ["weights.list"]


async def test_a_removed_models_files_are_collected_where_a_node_holds_them(
    fleet: Fleet,
) -> None:
    holds = Cache(("m-q4", "hf:org/m"), ("m-q8", "hf:org/m"), ("n", "hf:org/n"))
    empty = Cache(("n", "hf:org/n"))
    a, b = holds.session(), empty.session()
    await fleet.node("a", a)
    await fleet.node("b", b)
    await fleet.service.remove_source("hf:org/m", CAROL)
    assert [e["name"] for e in holds.entries] == ["n"]
    assert b.kinds() == ["weights.list"]  # nothing of it there: nothing asked, nor audited
    assert await fleet.audit() == [
        ("carol@10.0.0.7", "weights.remove", "a", "hf:org/m: ['m-q4', 'm-q8']")
    ]


# ------------------------------------------------------------------ marks


async def test_marks_cordon_drain_uncordon_each_kept_and_audited(fleet: Fleet) -> None:
    view = await fleet.node("n1")

    async def kept() -> tuple[bool, bool]:
        stored = await fleet.store.get_node("n1")
        assert stored is not None
        return stored.cordoned, stored.draining

    await fleet.service.mark("n1", "cordon", CAROL)
    assert (view.cordoned, view.draining) == (True, False) == await kept()
    await fleet.service.mark("n1", "drain", CAROL)
    assert (view.cordoned, view.draining) == (True, True) == await kept()
    await fleet.service.mark("n1", "uncordon", CAROL)  # also ends the drain
    assert (view.cordoned, view.draining) == (False, False) == await kept()
    assert [a[1:3] for a in await fleet.audit()] == [
        ("node.cordon", "n1"),
        ("node.drain", "n1"),
        ("node.uncordon", "n1"),
    ]
    assert {a[0] for a in await fleet.audit()} == {"carol@10.0.0.7"}


async def test_labels_are_set_and_removed_leaving_the_rest(fleet: Fleet) -> None:
    view = await fleet.node("n1")
    await fleet.service.mark("n1", "labels", CAROL, LabelsRequest(set={"zone": "a", "rack": "r1"}))
    assert view.labels == {"zone": "a", "rack": "r1"}
    await fleet.service.mark(
        "n1", "labels", CAROL, LabelsRequest(set={"zone": "b"}, remove=("rack", "absent"))
    )
    assert view.labels == {"zone": "b"}
    stored = await fleet.store.get_node("n1")
    assert stored is not None and stored.labels == {"zone": "b"}
    assert not view.cordoned and not view.draining
    assert [a[1] for a in await fleet.audit()] == ["node.labels", "node.labels"]


async def test_a_mark_on_a_node_never_enrolled_is_404(fleet: Fleet) -> None:
    with pytest.raises(Refusal) as refused:
        await fleet.service.mark("ghost", "cordon", CAROL)
    assert refused.value.status == 404
    assert await fleet.audit() == []


# ------------------------------------------------------------------ shard rows


def test_shard_rows_flatten_each_shard_with_its_download_and_usage() -> None:
    a = NodeView(id="a", cert_serial=1)
    a.shards["r2"] = ShardStatus(
        replica_id="r2",
        state=ShardState.LOADING,
        engine="vllm",
        source="hf:org/m",
        port=9002,
        pid=42,
        fingerprint="f1",
        compute=Compute(backend="cuda", devices=["GPU-0"], offloaded_layers=3, total_layers=3),
        last_lines=["loading"],
    )
    a.shards["r1"] = ShardStatus(replica_id="r1", state=ShardState.DOWNLOADING, source="hf:org/n")
    a.downloads["hf:org/n"] = {
        "source": "hf:org/n",
        "replica_ids": ["r1"],
        "done": 5,
        "total": 10,
        "file": "n.gguf",
    }
    a.usage["r2"] = ShardUsage("r2", cpu_percent=12.5, rss=1024)
    b = NodeView(id="b", cert_serial=1)

    rows = shard_rows([a, b])
    assert [(r["replica_id"], r["node"], r["state"]) for r in rows] == [
        ("r1", "a", "downloading"),
        ("r2", "a", "loading"),
    ]
    downloading, loading = rows
    assert downloading["download"] == {
        "source": "hf:org/n",
        "done": 5,
        "total": 10,
        "file": "n.gguf",
    }
    assert downloading["backend"] is None and downloading["devices"] == []
    assert downloading["cpu_percent"] is None and downloading["rss"] is None
    assert loading["download"] is None
    assert (loading["backend"], loading["devices"], loading["offloaded_layers"]) == (
        "cuda",
        ["GPU-0"],
        3,
    )
    assert (loading["cpu_percent"], loading["rss"], loading["pid"]) == (12.5, 1024, 42)
    assert loading["last_lines"] == ["loading"] and loading["fingerprint"] == "f1"
    assert type(loading["state"]) is str
