"""``ModelViews``: what a model and each replica look like, read from a real reconciler
driven pass by pass with the agents' reports written into the node views. The model's
state word (parked, stopped, idle or scaled to zero, serving, degraded, starting); a
standby's ready count taken from the gateway's endpoints when no pass ran here; an
external provider's endpoints shown by name and weight, never a key; the replicas
listing with the catalog's word on each; a CPU profile's speed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.config import SchedulingConfig
from llmgw.modelkit import sizing
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.model import Model, Profile, fingerprint, shape_json
from llmgw.server.catalog.reconciler import Plan, Reconciler
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.gateway.router import Endpoint
from llmgw.server.store import SQLiteStore
from llmgw.wire.messages import EngineInfo, ShardStatus
from llmgw.wire.states import NodeState, ShardState
from tests.support import nodefacts, wiring

GIB = 1024**3
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
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Views:
    views: ModelViews
    reconciler: Reconciler
    registry: NodeRegistry
    models: dict[str, Model]
    passes: list[int] = field(default_factory=lambda: [0])
    # What the gateway routes to now, by model.
    routed: dict[str, list[Endpoint]] = field(default_factory=dict)

    def add(self, model: Model) -> Model:
        self.models[model.name] = model
        return model

    def node(self, node_id: str, **live: Any) -> NodeView:
        view = NodeView(
            id=node_id,
            cert_serial=1,
            state=NodeState.READY,
            address=f"10.0.0.{len(self.registry.nodes) + 1}",
            facts=nodefacts.facts(
                cpu_count=16, memory_total=64 * GIB, memory_available=64 * GIB, gpus=[]
            ),
            live=nodefacts.live(**live),
            last_heartbeat=1000.0,
            engines=[EngineInfo(name="llama.cpp", path="/x")],
            engines_probed=True,
        )
        self.registry.nodes[node_id] = view
        return view

    def run_pass(self) -> Plan:
        """A reconcile pass here, as Dispatch makes one."""
        self.passes[0] += 1
        return self.reconciler.plan(list(self.models.values()), self.registry.nodes)

    def report(self, plan: Plan, state: ShardState) -> None:
        """Each start of ``plan`` reported by its node in ``state``."""
        for start in plan.starts:
            self.registry.nodes[start.node].shards[start.replica_id] = ShardStatus(
                replica_id=start.replica_id,
                state=state,
                fingerprint=self.reconciler.tracks[start.replica_id].fingerprint,
                port=start.port,
                source="/models/m.gguf",
            )

    def set_state(self, replica_id: str, state: ShardState) -> None:
        for view in self.registry.nodes.values():
            if replica_id in view.shards:
                view.shards[replica_id] = replace(view.shards[replica_id], state=state)


@pytest.fixture
async def views(tmp_path: Path) -> AsyncIterator[Views]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    reconciler = wiring.reconciler(SchedulingConfig(), clock=Clock())
    registry = wiring.registry(store)
    models: dict[str, Model] = {}
    passes = [0]
    routed: dict[str, list[Endpoint]] = {}

    def endpoints_of(name: str) -> Sequence[Endpoint]:
        return routed.get(name, [])

    made = ModelViews(models, reconciler, lambda: passes[0], registry, endpoints_of)
    try:
        yield Views(made, reconciler, registry, models, passes, routed)
    finally:
        await store.close()


def model(replicas: int = 2, **kw: Any) -> Model:
    profile = Profile(name="default", engine="llama.cpp", replicas=replicas, memory=GIB)
    base = Model(
        name="m", source="/models/m.gguf", engine="llama.cpp", profiles=(profile,), context=512
    )
    return replace(base, **kw)


def state(views: Views, name: str = "m") -> tuple[str, int, int]:
    shown = views.views.model_json(views.models[name])
    return shown["state"], shown["ready"], shown["desired"]


# ------------------------------------------------------------------ state words


async def test_a_model_is_starting_then_degraded_then_serving(views: Views) -> None:
    views.node("a")
    views.add(model(replicas=2))
    plan = views.run_pass()
    assert len(plan.starts) == 2
    views.report(plan, ShardState.LOADING)
    views.run_pass()
    assert state(views) == ("starting", 0, 2)
    shown = views.views.model_json(views.models["m"])
    assert shown["starting"] == 2 and shown["profiles"][0]["status"]["starting"] == 2

    first, second = (s.replica_id for s in plan.starts)
    views.set_state(first, ShardState.READY)
    views.run_pass()
    assert state(views) == ("degraded", 1, 2)
    views.set_state(second, ShardState.READY)
    views.run_pass()
    assert state(views) == ("serving", 2, 2)
    shown = views.views.model_json(views.models["m"])
    (profile,) = shown["profiles"]
    assert profile["status"]["ready"] == 2
    assert profile["fingerprint"] == fingerprint(views.models["m"], views.models["m"].profiles[0])


async def test_parked_stopped_idle_and_scaled_to_zero(views: Views) -> None:
    views.node("a")
    views.add(model(name="parked", parked="failed 3 times in a row", on_demand=True))
    views.add(model(name="stopped", stopped=True))
    views.add(model(name="idle", on_demand=True))
    views.add(model(name="plain"))
    views.run_pass()
    assert state(views, "parked") == ("parked", 0, 0)
    assert state(views, "stopped") == ("stopped", 0, 0)
    assert state(views, "idle") == ("idle", 0, 0)
    assert state(views, "plain") == ("starting", 0, 2)
    # Asked for, an on-demand model wants its replicas.
    views.reconciler.want("idle")
    assert state(views, "idle") == ("starting", 0, 2)
    # `llmgw stop`: every model at zero, the catalog unchanged.
    views.reconciler.halt(True)
    assert state(views, "plain") == ("scaled to zero", 0, 0)
    assert views.views.model_json(views.models["plain"])["replicas"] == 2
    # A model both stopped and parked says parked.
    views.add(model(name="both", stopped=True, parked="failed"))
    assert state(views, "both")[0] == "parked"


async def test_a_standby_counts_ready_from_the_gateways_endpoints(views: Views) -> None:
    """No pass ran here: the reconciler knows nothing, what routes now is Ready."""
    views.add(model(replicas=2))

    def endpoint(replica_id: str) -> Endpoint:
        return Endpoint(replica_id=replica_id, url="http://10.0.0.1:41000", key="k", priority=0)

    assert state(views) == ("starting", 0, 2)
    views.routed["m"] = [endpoint("m.default.00000001")]
    assert state(views) == ("degraded", 1, 2)
    views.routed["m"].append(endpoint("m.default.00000002"))
    assert state(views) == ("serving", 2, 2)
    # Once a pass runs here, the reconciler's count is taken, not the gateway's.
    views.run_pass()
    assert state(views) == ("starting", 0, 2)


async def test_a_model_takes_images_once_a_replica_it_routes_to_says_so(views: Views) -> None:
    views.add(model(replicas=2, allow_image_urls=True))

    def endpoint(replica_id: str, vision: bool | None) -> Endpoint:
        return Endpoint(replica_id, "http://10.0.0.1:41000", "k", 0, vision=vision)

    shown = views.views.model_json(views.models["m"])
    assert (shown["vision"], shown["allow_image_urls"]) == (False, True)
    views.routed["m"] = [endpoint("m.default.00000001", None)]
    assert views.views.model_json(views.models["m"])["vision"] is False
    views.routed["m"].append(endpoint("m.default.00000002", True))
    assert views.views.model_json(views.models["m"])["vision"] is True


# ------------------------------------------------------------------ external providers


async def test_an_external_providers_endpoints_never_show_a_key(views: Views) -> None:
    views.add(
        model(
            name="gpt",
            replicas=0,
            external={
                "base_url": "https://api.example.com/v1",
                "upstream_model": "gpt-x",
                "keys": [
                    {"sealed": "SEALED-ONE", "weight": 2.0},
                    {"sealed": "SEALED-TWO"},
                ],
            },
        )
    )
    views.routed["gpt"] = [
        Endpoint(
            replica_id="external:gpt#2",
            url="https://api.example.com/v1",
            key="sk-provider-secret",
            priority=0,
            external=True,
            open_until=time.monotonic() + 60,
            problem="401 from the provider: the key was refused",
        ),
        Endpoint(
            replica_id="external:gpt#1",
            url="https://api.example.com/v1",
            key="sk-provider-other",
            priority=0,
            external=True,
        ),
    ]
    shown = views.views.model_json(views.models["gpt"])
    assert "SEALED" not in repr(shown) and "sk-provider" not in repr(shown)
    assert "sealed" not in repr(shown)
    assert (shown["engine"], shown["source"], shown["state"]) == (
        "external",
        "https://api.example.com/v1",
        "serving",
    )
    assert (shown["replicas"], shown["desired"], shown["ready"]) == (2, 2, 1)
    assert shown["external"]["upstream_model"] == "gpt-x"
    assert shown["external"]["endpoints"] == [
        {"name": "external:gpt#1", "weight": 2.0, "state": "ok", "problem": ""},
        {
            "name": "external:gpt#2",
            "weight": 1.0,
            "state": "passed over",
            "problem": "401 from the provider: the key was refused",
        },
    ]

    # Every key passed over: unavailable.
    views.routed["gpt"][1].open_until = time.monotonic() + 60
    assert views.views.model_json(views.models["gpt"])["state"] == "unavailable"


async def test_a_stopped_external_provider_says_stopped(views: Views) -> None:
    external = {"base_url": "https://api.example.com/v1", "keys": [{"sealed": "S"}]}
    views.add(model(name="gpt", replicas=0, external=external, stopped=True))
    shown = views.views.model_json(views.models["gpt"])
    assert shown["stopped"] and shown["state"] == "stopped"


# ------------------------------------------------------------------ listings


async def test_the_catalog_is_listed_by_name(views: Views) -> None:
    for name in ("zeta", "alpha", "mid"):
        views.add(model(name=name))
    assert [m["name"] for m in views.views.catalog()] == ["alpha", "mid", "zeta"]


async def test_replicas_carry_the_catalogs_word_and_their_cards(views: Views) -> None:
    a = views.node("a")
    current = views.add(model(replicas=1))
    plan = views.run_pass()
    views.report(plan, ShardState.READY)
    (start,) = plan.starts
    a.shards["m.default.0badf00d"] = ShardStatus(
        replica_id="m.default.0badf00d", state=ShardState.READY, fingerprint="an-older-one"
    )
    a.shards["by-hand"] = ShardStatus(
        replica_id="by-hand", state=ShardState.READY, fingerprint="direct"
    )
    a.shards["gone.default.0000abcd"] = ShardStatus(
        replica_id="gone.default.0000abcd", state=ShardState.READY, fingerprint="f"
    )
    rows = {r["replica_id"]: r for r in views.views.replicas()}
    assert set(rows) == {start.replica_id, "m.default.0badf00d", "by-hand", "gone.default.0000abcd"}
    ours = rows[start.replica_id]
    assert (ours["model"], ours["profile"], ours["stale"], ours["note"]) == (
        "m",
        "default",
        False,
        "",
    )
    assert ours["fingerprint"] == fingerprint(current, current.profiles[0])
    assert ours["cards"] == [] and ours["node"] == "a"
    old = rows["m.default.0badf00d"]
    assert old["stale"] and "llmgw ctl model restart m" in old["note"]
    assert (rows["by-hand"]["model"], rows["by-hand"]["note"]) == (None, "")
    assert rows["gone.default.0000abcd"]["note"] == "not in the catalog"


# ------------------------------------------------------------------ speed on CPUs


async def test_a_cpu_profiles_speed_is_the_fastest_ready_node_that_measured(
    views: Views,
) -> None:
    views.node("slow", memory_read_gbs=20.0)
    views.node("fast", memory_read_gbs=80.0)
    lost = views.node("lost", memory_read_gbs=400.0)
    lost.state = NodeState.NOT_READY
    views.node("unmeasured")
    m = views.add(model(shape=shape_json(SHAPE)))
    (profile,) = m.profiles
    expected = round(sizing.cpu_tokens_per_second(SHAPE, 80.0), 1)
    assert views.views.cpu_speed(m, profile) == expected
    assert expected > round(sizing.cpu_tokens_per_second(SHAPE, 20.0), 1)
    shown = views.views.model_json(m)
    assert shown["profiles"][0]["cpu_tokens_per_second"] == expected


async def test_a_cpu_speed_is_bounded_by_the_cores_a_profile_takes(views: Views) -> None:
    views.node("a", memory_read_gbs=80.0, memory_read_one_core_gbs=5.0)
    m = views.add(model(shape=shape_json(SHAPE)))
    two_cores = replace(m.profiles[0], cpu_cores=2.0)
    limited = views.views.cpu_speed(m, two_cores)
    assert limited == round(sizing.cpu_tokens_per_second(SHAPE, 80.0, 2, 5.0), 1)
    whole = views.views.cpu_speed(m, m.profiles[0])
    assert limited is not None and whole is not None and limited < whole


async def test_no_cpu_speed_on_cards_without_a_shape_or_a_measure(views: Views) -> None:
    views.node("a", memory_read_gbs=80.0)
    shaped = views.add(model(shape=shape_json(SHAPE)))
    on_cards = replace(shaped.profiles[0], cards=1)
    assert views.views.cpu_speed(shaped, on_cards) is None
    unshaped = views.add(model(name="unshaped"))
    assert views.views.cpu_speed(unshaped, unshaped.profiles[0]) is None
    views.registry.nodes["a"].live = nodefacts.live()
    assert views.views.cpu_speed(shaped, shaped.profiles[0]) is None
