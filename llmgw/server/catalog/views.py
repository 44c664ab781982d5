"""What the admin API and pages show of a model: its state, profiles and speed, or an
external provider's endpoints; and of each replica the nodes report, the catalog's
view of it. Read-only views over the catalog, the reconciler, the nodes and the
gateway's live endpoints (handed in as a function); they change nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

from llmgw.modelkit import sizing
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.model import Model, Profile
from llmgw.server.catalog.reconciler import ProfileStatus, Reconciler
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.service import shard_rows
from llmgw.wire.admin import (
    EndpointJson,
    ModelJson,
    ModelState,
    ProfileJson,
    ProfileStatusJson,
    ReplicaJson,
    ShapeJson,
)
from llmgw.wire.states import NodeState


class Routed(Protocol):
    """What a view reads of a replica the gateway routes to now."""

    @property
    def replica_id(self) -> str: ...

    @property
    def problem(self) -> str: ...

    @property
    def open_until(self) -> float: ...

    @property
    def vision(self) -> bool | None: ...


EndpointsOf = Callable[[str], Sequence[Routed]]


class ModelViews:
    def __init__(
        self,
        models: Mapping[str, Model],
        reconciler: Reconciler,
        passes: Callable[[], int],
        registry: NodeRegistry,
        endpoints_of: EndpointsOf,
    ) -> None:
        """``models`` is the catalog as it stands; ``passes`` the reconcile passes made
        here (none on a standby); ``endpoints_of`` the replicas the gateway routes a
        model to now."""
        self.models = models
        self.reconciler = reconciler
        self.passes = passes
        self.registry = registry
        self.endpoints_of = endpoints_of

    def catalog(self) -> list[ModelJson]:
        """Every model of the catalog, by name."""
        return [self.model_json(m) for _, m in sorted(self.models.items())]

    def replicas(self) -> list[ReplicaJson]:
        """Every shard every node reports, with the catalog's view of it (its model and
        profile, whether it is stale and why) and the cards it holds."""
        out: list[ReplicaJson] = []
        for row in shard_rows([v for _, v in sorted(self.registry.nodes.items())]):
            rid = row["replica_id"]
            seen = self.reconciler.describe(rid, self.models, row["fingerprint"])
            out.append(
                {
                    **row,
                    "model": seen["model"],
                    "profile": seen["profile"],
                    "stale": seen["stale"],
                    "note": seen["note"],
                    "cards": self.reconciler.cards_of(rid),
                }
            )
        return out

    def model_json(self, model: Model) -> ModelJson:
        profiles: list[ProfileJson] = []
        ready = starting = stale = 0
        for p in model.profiles:
            status = self.reconciler.status_of(model.name, p.name)
            if status:
                ready += status.ready
                starting += status.starting
                stale += status.stale
            profiles.append(
                profile_json(
                    p,
                    catalog.fingerprint(model, p),
                    status_json(status) if status else None,
                    self.cpu_speed(model, p),
                )
            )
        if model.external:
            return self.external_json(model)
        if self.passes() == 0:
            # No reconcile pass here (a standby): what routes now is what is Ready.
            ready = len(self.endpoints_of(model.name))
        now = self.reconciler.now()
        desired = sum(self.reconciler.desired(model, p, now) for p in model.profiles)
        state: ModelState
        if model.parked:
            state = "parked"
        elif model.stopped:
            state = "stopped"
        elif desired == 0:
            state = "idle" if model.on_demand else "scaled to zero"
        elif ready >= desired:
            state = "serving"
        elif ready:
            state = "degraded"
        else:
            state = "starting"
        return {
            "name": model.name,
            "source": model.source,
            "engine": model.engine,
            "state": state,
            "replicas": model.replicas,
            "desired": desired,
            "ready": ready,
            "starting": starting,
            "stale": stale,
            "context": model.context,
            "slots": model.slots,
            "max_output": model.max_output,
            "on_demand": model.on_demand,
            "kv_events": model.kv_events,
            "stopped": model.stopped,
            "parked": model.parked,
            "allow_pickle": model.allow_pickle,
            "vision": any(e.vision for e in self.endpoints_of(model.name)),
            "allow_image_urls": model.allow_image_urls,
            "weight_bytes": model.weight_bytes or None,
            # What ``shape_json`` wrote when the model was inspected (``{}`` if never).
            "shape": cast(ShapeJson, dict(model.shape)),
            "profiles": profiles,
            "adapters": [
                {"name": a.name, "source": a.source, "scale": a.scale} for a in model.adapters
            ],
        }

    def cpu_speed(self, model: Model, profile: Profile) -> float | None:
        """A CPU profile's reply speed on the fastest Ready node that measured its
        memory read rate; None on cards (not estimated) or when no node measured."""
        if profile.cards:
            return None
        shape = catalog.shape_of(model)
        if shape is None:
            return None
        best: float | None = None
        threads = int(profile.cpu_cores) or None
        for view in self.registry.nodes.values():
            figures = view.figures()
            rate = figures.memory_read_gbs
            if view.state != NodeState.READY or rate is None:
                continue
            speed = sizing.cpu_tokens_per_second(
                shape, rate, threads, figures.memory_read_one_core_gbs
            )
            if speed and (best is None or speed > best):
                best = round(speed, 1)
        return best

    def external_json(self, model: Model) -> ModelJson:
        """An external provider's model: its endpoints by name and weight, never a key."""
        spec = model.external or {}
        base_url = spec["base_url"]  # always written with the provider (catalog/service.py)
        live = {e.replica_id: e for e in self.endpoints_of(model.name)}
        endpoints: list[EndpointJson] = []
        for i, entry in enumerate(spec.get("keys") or [], start=1):
            name = f"external:{model.name}#{i}"
            endpoint = live.get(name)
            problem = endpoint.problem if endpoint else ""
            passed_over = bool(endpoint and endpoint.open_until > time.monotonic())
            endpoints.append(
                {
                    "name": name,
                    "weight": entry.get("weight", 1.0),
                    "state": "passed over" if passed_over else "ok",
                    "problem": problem,
                }
            )
        usable = sum(1 for e in endpoints if e["state"] == "ok")
        # Stopped, /v1 refuses it (model_stopped) whatever its endpoints could answer.
        state: ModelState = "stopped" if model.stopped else "serving" if usable else "unavailable"
        return {
            "name": model.name,
            "source": base_url,
            "engine": "external",
            "state": state,
            "replicas": len(endpoints),
            "desired": len(endpoints),
            "ready": usable,
            "starting": 0,
            "stale": 0,
            "context": model.context,
            "slots": model.slots,
            "max_output": model.max_output,
            "on_demand": False,
            "kv_events": False,
            "stopped": model.stopped,
            "parked": None,
            "allow_pickle": False,
            "vision": False,
            "allow_image_urls": False,
            "weight_bytes": None,
            "shape": {},
            "profiles": [],
            "external": {
                "base_url": base_url,
                "upstream_model": spec.get("upstream_model"),
                "endpoints": endpoints,
            },
        }


def profile_json(
    p: Profile, fingerprint: str, status: ProfileStatusJson | None, speed: float | None
) -> ProfileJson:
    """A profile as the API shows it: its fields (``Profile.to_spec``, in that order),
    then its fingerprint, where its replicas stand and a CPU profile's reply speed."""
    return {
        "name": p.name,
        "engine": p.engine,
        "args": list(p.args),
        "cards": p.cards,
        "cpu_cores": p.cpu_cores,
        "replicas": p.replicas,
        "priority": p.priority,
        "selector": dict(p.selector),
        "role": p.role,
        "card_class": p.card_class,
        "memory": p.memory,
        "card_memory": p.card_memory,
        "memory_set": p.memory_set,
        "nodes": p.nodes,
        "env": dict(p.env),
        "fingerprint": fingerprint,
        "status": status,
        "cpu_tokens_per_second": speed,
    }


def status_json(status: ProfileStatus) -> ProfileStatusJson:
    return {
        "desired": status.desired,
        "ready": status.ready,
        "starting": status.starting,
        "stale": status.stale,
        "replacing": status.replacing,
        "note": status.note,
    }
