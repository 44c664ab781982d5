"""The simulation against a real control plane: the same fleet and models, placed by a
control plane loaded as ``server run`` loads it (its store, registry, catalog service,
reconciler and reconcile loop) with a stand-in agent enrolled and registered for every
node (its session records what it is sent), and by ``llmgw sim``, give every replica
the same node and the same cards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.model import parse_replica_id
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.principal import Principal
from llmgw.server.requests import ServeRequest
from llmgw.server.schema import read
from llmgw.server.store.values import Audit
from llmgw.sim.cards import parse_nodes
from llmgw.sim.fleet import generated, read_fleet
from llmgw.sim.models import SIM_FIELDS, read_models
from llmgw.sim.run import Simulation
from llmgw.wire.messages import Register, StartShard
from tests.sim.conftest import FIXTURES, LLAMA_8B, MODELS, Write
from tests.support.agentsession import FakeSession
from tests.support.inprocessplane import fresh_data_dir, loaded_plane

Placed = list[tuple[str, str, tuple[str, ...]]]

# Enough to fill most of the fleet, of several sizes, so binpack's choices matter.
CATALOG = [
    {**MODELS[1], "replicas": 3},
    {**MODELS[0], "replicas": 9},
    {**MODELS[0], "name": "llama-8b-zoned", "replicas": 2, "selector": {"zone": "b"}},
    {
        "source": "hf:a/cpu-model",
        "name": "on-cpu",
        "engine": "llama.cpp",
        "memory": 16 << 30,
        "cpu_cores": 8,
        "replicas": 2,
        "tokens_per_second": 20,
        "prefill_tokens_per_second": 300,
    },
    {
        "source": "hf:a/small",
        "name": "small",
        "engine": "vllm",
        "gpus": 2,
        "replicas": 2,
        "shape": LLAMA_8B,
        "context": 4096,
    },
]

FLEETS: dict[str, Callable[[], dict[str, NodeView]]] = {
    "recorded": lambda: read_fleet(FIXTURES / "nodes.json"),
    "generated": lambda: generated(parse_nodes("5x8xL40S")),
}


async def simulated(fleet: dict[str, NodeView], models: Path) -> Placed:
    cards = [g.memory_total or 0 for v in fleet.values() for g in v.figures().gpus]
    host = max(v.figures().memory_total or 0 for v in fleet.values())
    sim = Simulation(fleet, read_models(models, cards, host), [], [])
    await sim.run()
    return sorted((r.model, r.node, tuple(r.cards)) for r in sim.replicas.values())


async def by_a_control_plane(root: Path, fleet: dict[str, NodeView], models: Path) -> Placed:
    cards = [g.memory_total or 0 for v in fleet.values() for g in v.figures().gpus]
    host = max(v.figures().memory_total or 0 for v in fleet.values())
    shapes: dict[str, ModelShape | None] = {
        s.model.source: s.shape for s in read_models(models, cards, host)
    }
    async with loaded_plane(root) as cp:
        sessions: dict[str, FakeSession] = {}
        for serial, (nid, view) in enumerate(fleet.items(), start=1):
            # A stand-in agent: enrolled, registered with the node's facts and its
            # engines at the versions the cluster wants (an agent converges on them
            # before it serves), labelled by the operator as the recorded node was.
            assert view.facts is not None
            sessions[nid] = FakeSession()
            await cp.registry.enrolled(nid, serial)
            engines = [
                replace(e, version=cp.engines.version_of(e.name) or e.version) for e in view.engines
            ]
            hello = Register(
                node_id=nid,
                version="sim",
                host=view.facts,
                address=view.address,
                engines=engines,
                engines_probed=True,
                installable_engines=view.installable,
            )
            await cp.registry.register(hello, sessions[nid])
            if view.labels or view.cordoned or view.draining:
                await cp.registry.set_scheduling(
                    cp.registry.nodes[nid],
                    view.cordoned,
                    view.draining,
                    dict(view.labels),
                    Audit("test", "node.label", nid),
                )

        async def inspect(source: str, allow_pickle: bool) -> ModelShape:
            shape = shapes[source]
            if shape is None:
                raise OSError("no shape: the test gives memory")
            return shape

        # The hub stands in: the inspector answers with the shape MODELS.yaml gives.
        cp.models.hooks = replace(cp.models.hooks, inspect=inspect)
        for entry in yaml.safe_load(models.read_text()):
            ask = read(ServeRequest, {k: v for k, v in entry.items() if k not in SIM_FIELDS})
            await cp.models.serve(ask, Principal.system("test"))
        await cp.models.dispatch.reconcile()
        placed: Placed = []
        for nid, session in sessions.items():
            for msg in session.sent:
                assert isinstance(msg, StartShard)
                parsed = parse_replica_id(msg.spec.replica_id)
                assert parsed is not None
                placed.append((parsed[0], nid, tuple(msg.spec.cards)))
        return sorted(placed)


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_the_same_placement_as_a_real_control_plane(
    tmp_path: Path, write: Write, fleet: str
) -> None:
    # The generated nodes have no labels: a zoned model would fit none (see test_run).
    catalog = [m for m in CATALOG if fleet == "recorded" or "selector" not in m]
    models = write("models.yaml", catalog)
    root, _ = fresh_data_dir(tmp_path)  # runs its own event loop: before the plane's
    expected = asyncio.run(by_a_control_plane(root, FLEETS[fleet](), models))
    got = asyncio.run(simulated(FLEETS[fleet](), models))
    assert expected, "the control plane placed nothing: the comparison would prove nothing"
    assert got == expected
    assert {m for m, _, _ in got} >= {"llama-70b", "llama-8b", "small"}
