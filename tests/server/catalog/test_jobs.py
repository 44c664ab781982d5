"""Serve jobs in process: the real catalog service, reconciler and registry over a SQLite
store, the nodes' reports handed to the registry as their agents send them, and the
clocks (the reconciler's and the jobs' wall clock) moved by hand, so nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmgw.config import SchedulingConfig
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.jobs import PLACE_PATIENCE, WRITE_EVERY
from llmgw.server.catalog.service import CatalogHooks, ModelService
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ServeRequest
from llmgw.server.schema import read
from llmgw.server.store import SQLiteStore
from llmgw.wire import admin
from llmgw.wire.messages import DownloadProgress, EngineInfo, Message, ShardStatus, StartShard
from llmgw.wire.states import NodeState, ShardState
from tests.support import wiring
from tests.support.nodefacts import facts
from tests.support.shapes import problems
from tests.support.wiring import ADMIN

GIB = 1024**3
SOURCE = "https://hub.example/m.gguf"
SHAPE = ModelShape(
    architecture="llama",
    parameters=1_000_000_000,
    file_bytes=2 * GIB,
    layers=16,
    embedding=2048,
    heads=16,
    kv_heads=4,
    head_size=128,
    trained_context=8192,
)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Link:
    """A node's session: what the control plane sends it is kept."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)


def node(nid: str) -> NodeView:
    return NodeView(
        id=nid,
        cert_serial=1,
        state=NodeState.READY,
        address="10.0.0.1",
        facts=facts(cpu_count=8, memory_total=16 * GIB, memory_available=16 * GIB),
        last_heartbeat=1000.0,
        session=Link(),  # type: ignore[arg-type]
        engines=[EngineInfo(name="llama.cpp", path="/x")],
        engines_probed=True,
    )


@dataclass
class Plane:
    service: ModelService
    registry: NodeRegistry
    store: SQLiteStore
    clock: Clock
    wall: Clock

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.wall.now += seconds

    async def serve(self, **body: Any) -> str:
        """Serve the test model; the job's id."""
        ask = read(ServeRequest, {"source": SOURCE, "name": "m", "context": 512, **body})
        _, job = await self.service.serve_job(ask, ADMIN)
        return job

    async def pass_(self) -> None:
        """A reconcile pass, then a look at the jobs."""
        await self.service.reconcile()
        await self.service.jobs.follow()

    def replica(self) -> str:
        (rid,) = [t.replica_id for t in self.service.reconciler.tracks.values()]
        return rid

    def report(self, state: ShardState, reason: str = "") -> None:
        rid = self.replica()
        track = self.service.reconciler.tracks[rid]
        status = ShardStatus(rid, state, reason, fingerprint=track.fingerprint, port=track.port)
        self.registry.report(track.node, status)

    def download(self, done: int, total: int | None = 4000, **kw: Any) -> None:
        progress = DownloadProgress(SOURCE, [self.replica()], done, total, "m.gguf", **kw)
        self.registry.report(self.service.reconciler.tracks[self.replica()].node, progress)

    async def job(self, job_id: str) -> admin.JobJson:
        return await self.service.jobs.get(job_id)

    async def kept(self, job_id: str) -> dict[str, Any]:
        record = await self.store.jobs.get(job_id)
        assert record is not None
        return record.body


def service_on(
    store: SQLiteStore, registry: NodeRegistry, clock: Clock, wall: Clock
) -> ModelService:
    async def inspect(source: str, allow_pickle: bool) -> ModelShape:
        return SHAPE

    async def keep(source: str, by: object) -> None:
        return None

    config = SchedulingConfig(start_timeout=60.0, node_lost_grace=30.0)
    service = ModelService(
        store,
        registry,
        wiring.reconciler(config, clock=clock),
        config,
        b"secret",
        asyncio.Event(),
        CatalogHooks(inspect=inspect, remove_files=keep),  # type: ignore[arg-type]
    )
    service.jobs.wall = wall
    return service


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    registry = wiring.registry(store, 1.0, 3)
    registry.nodes["a"] = node("a")
    clock, wall = Clock(1000.0), Clock(1.7e9)
    try:
        yield Plane(service_on(store, registry, clock, wall), registry, store, clock, wall)
    finally:
        await store.close()


def states(job: admin.JobJson) -> dict[str, str]:
    return {s["name"]: s["state"] for s in job["steps"]}


async def test_a_serve_job_goes_through_its_steps_with_bytes_and_rate(plane: Plane) -> None:
    job_id = await plane.serve()
    assert job_id.startswith("job-") and len(job_id) == 16
    kept = await plane.kept(job_id)
    assert problems(admin.JobJson, kept) == []
    assert states(kept) == {
        "resolve": "done",
        "plan": "done",
        "place": "running",
        "fetch": "pending",
        "start": "pending",
        "ready": "pending",
    }
    assert SOURCE in kept["steps"][0]["detail"] and kept["state"] == "running"

    await plane.pass_()
    job = await plane.job(job_id)
    assert (job["step"], job["steps"][2]["detail"]) == ("fetch", "on a")
    assert [type(m) for m in plane.registry.nodes["a"].session.sent] == [StartShard]  # type: ignore[union-attr]

    plane.report(ShardState.DOWNLOADING, f"fetching {SOURCE}")
    plane.download(1000)
    plane.tick(0.5)
    await plane.pass_()
    plane.download(3000)
    plane.tick(1.0)
    await plane.pass_()
    job = await plane.job(job_id)
    (where,) = job["nodes"]
    assert (where["node"], where["done"], where["total"], where["file"]) == (
        "a",
        3000,
        4000,
        "m.gguf",
    )
    assert where["rate_bytes_per_s"] == pytest.approx(2000.0)
    assert job["steps"][3]["detail"] == "2.9 KiB of 3.9 KiB"
    # Progress reaches the store at most every WRITE_EVERY seconds, not on every move:
    # 1.5 s after it began, the store still has the job as it began.
    kept = await plane.kept(job_id)
    assert (kept["step"], kept["nodes"]) == ("place", [])
    plane.tick(WRITE_EVERY)
    await plane.pass_()
    assert (await plane.kept(job_id))["nodes"][0]["done"] == 3000

    plane.download(4000, finished=True)
    plane.report(ShardState.LOADING, "llama.cpp started, pid 7")
    await plane.pass_()
    job = await plane.job(job_id)
    assert (job["step"], job["steps"][4]["detail"]) == ("start", "llama.cpp started, pid 7")
    assert job["nodes"][0]["done"] == 4000 and job["nodes"][0]["rate_bytes_per_s"] is None

    plane.report(ShardState.READY)
    await plane.pass_()
    kept = await plane.kept(job_id)  # the end is written at once
    assert kept["state"] == "succeeded" and kept["error"] is None
    assert set(states(kept).values()) == {"done"}
    assert job_id not in plane.service.jobs.running
    assert [j["id"] for j in await plane.service.jobs.newest(model="m")] == [job_id]


async def test_a_fetch_error_fails_the_job_at_fetch_saying_why(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    plane.report(ShardState.DOWNLOADING)
    plane.download(100, error="HTTP 404 from hub.example for m.gguf")
    await plane.pass_()
    plane.report(ShardState.FAILED, "HTTP 404 from hub.example for m.gguf")
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["state"] == "failed" and job["step"] == "fetch"
    assert job["error"] == {
        "step": "fetch",
        "reason": "fetching on a: HTTP 404 from hub.example for m.gguf",
    }
    assert states(job)["fetch"] == "failed" and states(job)["start"] == "pending"
    assert (await plane.kept(job_id))["state"] == "failed"


async def test_the_start_timeout_counts_from_the_download_s_last_move(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    plane.report(ShardState.DOWNLOADING)
    for step in range(1, 5):  # four minutes of a slow download past a 60 s timeout
        plane.download(step * 100, total=None)
        await plane.pass_()
        plane.tick(50)
        await plane.pass_()
        assert (await plane.job(job_id))["state"] == "running"
    plane.tick(11)  # it stalls: 61 s since the last byte
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["error"] is not None and job["error"]["step"] == "fetch"
    assert "60 s after it last made progress (state downloading)" in job["error"]["reason"]


async def test_an_engine_that_exits_while_loading_fails_the_job_at_start(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    plane.report(ShardState.LOADING)
    await plane.pass_()
    plane.report(ShardState.FAILED, "the engine exited with code 1: unknown model arch")
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["error"] == {
        "step": "start",
        "reason": "the engine exited with code 1: unknown model arch",
    }
    assert states(job)["fetch"] == "done"


async def test_nowhere_to_place_fails_the_job_at_place_after_its_patience(plane: Plane) -> None:
    job_id = await plane.serve()
    plane.registry.nodes["a"].cordoned = True
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["state"] == "running" and "no node fits" in job["steps"][2]["detail"]
    plane.tick(PLACE_PATIENCE)
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["error"] is not None and job["error"]["step"] == "place"
    assert "no node fits" in job["error"]["reason"]


async def test_a_removed_model_fails_its_job(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    await plane.service.remove(plane.service.find("m"), False, ADMIN)
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["error"] == {"step": "fetch", "reason": "the model was removed from the catalog"}


async def test_an_on_demand_model_s_job_ends_once_planned(plane: Plane) -> None:
    job_id = await plane.serve(on_demand=True)
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["state"] == "succeeded"
    assert job["steps"][-1]["detail"] == "on demand: started on its first request"


async def test_a_new_leader_carries_a_running_job_on_from_the_store(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    rid = plane.replica()
    # The leader goes; another starts over the same store with the agents' reports.
    other = service_on(plane.store, plane.registry, plane.clock, plane.wall)
    await other.load()
    await other.jobs.carry_on()
    assert list(other.jobs.running) == [job_id]
    track = plane.service.reconciler.tracks[rid]
    ready = ShardStatus(rid, ShardState.READY, fingerprint=track.fingerprint, port=track.port)
    plane.registry.report("a", ready)
    await other.reconcile()
    await other.jobs.follow()
    assert (await plane.kept(job_id))["state"] == "succeeded"


async def test_a_standby_answers_from_the_store_and_an_unknown_job_is_404(plane: Plane) -> None:
    job_id = await plane.serve()
    standby = service_on(plane.store, plane.registry, plane.clock, plane.wall)
    assert (await standby.jobs.get(job_id))["id"] == job_id
    with pytest.raises(Refusal) as refused:
        await standby.jobs.get("job-000000000000")
    assert refused.value.status == 404 and "ctl jobs" in refused.value.message


async def test_a_download_seen_once_then_finished_shows_its_whole(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    plane.report(ShardState.DOWNLOADING)
    plane.download(1000)
    await plane.pass_()
    (seen,) = (await plane.job(job_id))["nodes"]
    assert (seen["done"], seen["rate_bytes_per_s"]) == (1000, None)  # one report: no rate yet
    plane.download(4000, finished=True)
    await plane.pass_()
    (seen,) = (await plane.job(job_id))["nodes"]
    assert (seen["done"], seen["total"], seen["rate_bytes_per_s"]) == (4000, 4000, None)


async def test_a_replica_spanning_nodes_fetches_until_its_worker_has_its_weights(
    plane: Plane,
) -> None:
    plane.registry.nodes["b"] = node("b")
    job_id = await plane.serve(nodes=2)
    await plane.pass_()
    rid = plane.replica()
    track = plane.service.reconciler.tracks[rid]
    (worker,) = track.workers
    plane.report(ShardState.LOADING, "waiting for its workers")
    sid = f"{rid}~1"
    status = ShardStatus(sid, ShardState.DOWNLOADING, fingerprint=track.fingerprint, rank=1)
    plane.registry.report(worker.node, status)
    plane.registry.report(worker.node, DownloadProgress(SOURCE, [sid], 500, 4000, "m.gguf"))
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["step"] == "fetch"
    assert {(n["node"], n["replica_id"], n["done"]) for n in job["nodes"]} == {
        (track.node, rid, None),
        (worker.node, sid, 500),
    }
    plane.tick(61)  # the worker's download stalls past the start timeout
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["error"] is not None and job["error"]["step"] == "fetch"


async def test_a_model_stopped_meanwhile_fails_its_job(plane: Plane) -> None:
    job_id = await plane.serve()
    await plane.pass_()
    await plane.service.stop(plane.service.find("m"), ADMIN)
    await plane.pass_()
    job = await plane.job(job_id)
    assert job["error"] == {"step": "fetch", "reason": "the model was stopped by an operator"}
