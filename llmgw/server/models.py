"""Models: the catalog's admin API, and the loop that makes the nodes run what it says.

``ModelService`` holds the catalog in memory (written through to the store with an
audit entry per change), runs the reconciler on every change and on a timer, and
turns its plan into StartShard and StopShard messages on the agents' streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmgw import modelplan, pki
from llmgw.enginerules import RULES
from llmgw.modelplan import ModelShape
from llmgw.server import catalog, scheduler
from llmgw.server.catalog import CatalogError, Model, Profile
from llmgw.server.planner import PickledWeights
from llmgw.server.reconciler import Plan, Reconciler
from llmgw.server.responses import error, json_body, unauthorised
from llmgw.server.store import Audit
from llmgw.wire.messages import StartShard, StopShard

if TYPE_CHECKING:
    from llmgw.server.controlplane import ControlPlane

log = logging.getLogger("llmgw.models")

# The shape of a model: read on the control plane, else from a node that holds it.
Inspect = Callable[[str, bool], Awaitable[ModelShape]]


def _provider_url(url: str) -> bool:
    """https://, or http:// to this machine only: a key sent in plain text elsewhere
    could be read on the way."""
    from urllib.parse import urlsplit

    from llmgw.sources import is_loopback_host

    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and is_loopback_host(parts.hostname)


class Refused(Exception):
    """A change the API answers with an error; carries the answer."""

    def __init__(self, answer: JSONResponse) -> None:
        super().__init__("refused")
        self.answer = answer


def _int(body: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(error(400, "bad_request", f"{key} must be a whole number", field=key))
    return value


def _number(body: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Refused(error(400, "bad_request", f"{key} must be a number", field=key))
    return float(value)


def _invalid(exc: CatalogError) -> Refused:
    return Refused(error(400, "invalid", str(exc), field=exc.field))


class ModelService:
    def __init__(self, cp: ControlPlane, inspect: Inspect) -> None:
        self.cp = cp
        self.models: dict[str, Model] = {}
        self.reconciler = Reconciler(cp.config.scheduling)
        self.inspect = inspect
        self._wake = asyncio.Event()
        self.last_plan = Plan()
        self._tasks: set[asyncio.Task[None]] = set()
        # Bumped on every change of the catalog: the gateway rebuilds its routes.
        self.version = 0

    async def load(self) -> None:
        for record in await self.cp.store.list_models():
            try:
                self.models[record.name] = Model.from_spec(record.spec)
            except (TypeError, ValueError) as exc:
                log.error("model %s in the store cannot be read (%s); left alone", record.name, exc)

    def wake(self) -> None:
        self._wake.set()

    # ----------------------------------------------------------------- the loop

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.cp.config.scheduling.interval
        while not stop.is_set():
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconcile pass failed; trying again")
            self._wake.clear()
            waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            # Let a burst of changes (several shard reports at once) arrive together.
            await asyncio.sleep(0.05)
        for task in list(self._tasks):
            task.cancel()

    async def reconcile(self) -> Plan:
        nodes = self.cp.registry.nodes
        plan = self.reconciler.plan(list(self.models.values()), nodes)
        self.last_plan = plan
        for stop in plan.stops:
            view = nodes.get(stop.node)
            log.info("stopping %s on %s: %s", stop.replica_id, stop.node, stop.reason)
            if view is not None and view.session is not None:
                await view.session.send(StopShard(replica_id=stop.replica_id))
        for start in plan.starts:
            model = self.models[start.model]
            profile = model.profile(start.profile)
            view = nodes.get(start.node)
            assert profile is not None
            if view is None or view.session is None:
                track = self.reconciler.tracks.pop(start.replica_id, None)
                if track is not None:
                    self.reconciler.failed(track, self.reconciler.clock(), "node not connected")
                continue
            key = pki.engine_key(self.cp.cluster_secret, start.replica_id)
            spec = catalog.shard_spec(
                model, profile, start.replica_id, start.port, start.cards, key
            )
            log.info(
                "starting %s on %s (port %d%s)",
                start.replica_id,
                start.node,
                start.port,
                f", cards {', '.join(start.cards)}" if start.cards else "",
            )
            await view.session.send(StartShard(spec=spec))
        for name, reason in plan.parks:
            parking = self.models.get(name)
            if parking is not None and not parking.parked:
                log.warning("parking on-demand model %s: %s", name, reason)
                audit = Audit("reconciler", "model.park", name, reason)
                await self._save(replace(parking, parked=reason), audit)
        return plan

    async def _save(self, model: Model, audit: Audit) -> None:
        await self.cp.store.put_model(model.name, model.to_spec(), audit)
        self.models[model.name] = model
        self.version += 1
        self.wake()

    # ------------------------------------------------------------------ checking

    async def shape(self, source: str, allow_pickle: bool) -> tuple[ModelShape | None, str]:
        try:
            return await self.inspect(source, allow_pickle), ""
        except PickledWeights as exc:
            raise Refused(error(400, "invalid", f"source: {exc}", field="source")) from None
        except Exception as exc:  # any reason it could not be read is said, not raised
            return None, str(exc) or type(exc).__name__

    def fleet(self, at_rest: bool) -> list[scheduler.NodeCapacity]:
        """Nodes as placement sees them now, or empty of replicas and Ready (``at_rest``:
        could this ever fit?)."""
        nodes = self.cp.registry.nodes
        caps = self.reconciler.capacities(nodes)
        if not at_rest:
            return caps
        out = []
        for cap in caps:
            if not cap.memory_total:
                continue  # a node never heard from: nothing to judge it by
            cards = tuple(replace(c, memory_free=c.memory_total, reserved=0) for c in cap.cards)
            out.append(
                replace(
                    cap,
                    ready=True,
                    cordoned=False,
                    cpu_reserved=0.0,
                    memory_available=cap.memory_total,
                    memory_reserved=0,
                    cards=cards,
                )
            )
        return out

    def check_fits(self, model: Model) -> None:
        """Refuse a model no node could ever hold, with every node's reason."""
        nodes = self.fleet(at_rest=True)
        if not nodes:
            return
        for profile in model.profiles:
            if not profile.replicas:
                continue
            request = self.reconciler.request(model, profile, 0.0)
            verdicts = scheduler.explain(replace(request, avoid=frozenset()), nodes)
            if any(v.ok for v in verdicts):
                continue
            reasons = "; ".join(f"{v.node}: {', '.join(v.reasons)}" for v in verdicts)
            raise Refused(
                error(
                    409,
                    "does_not_fit",
                    f"{model.name} (profile {profile.name}) fits no node even with nothing "
                    f"else running: {reasons}",
                    verdicts=[v.as_json() for v in verdicts],
                )
            )

    def check_room(self, model: Model, changed: Model) -> None:
        """A change that needs new replicas starts them beside the old: refuse when
        there is no room for one beside them (``in_place`` stops first)."""
        if changed.in_place or changed.stopped:
            return
        caps = self.fleet(at_rest=False)
        for profile in changed.profiles:
            old = model.profile(profile.name)
            if old is None or not profile.replicas:
                continue
            if catalog.fingerprint(changed, profile) == catalog.fingerprint(model, old):
                continue
            if not any(
                t.model == model.name and t.profile == profile.name
                for t in self.reconciler.tracks.values()
            ):
                continue  # nothing runs now: nothing to be beside
            result = scheduler.place(self.reconciler.request(changed, profile, 0.0), caps)
            if isinstance(result, scheduler.Refusal):
                raise Refused(
                    error(
                        409,
                        "no_room",
                        f"no room to start the changed replicas of {model.name} beside the "
                        f"running ones ({result.reason}); add --in-place to stop each "
                        "replica before its replacement starts",
                        verdicts=[v.as_json() for v in result.verdicts],
                    )
                )

    def largest_room(self, cards: int) -> int | None:
        nodes = self.fleet(at_rest=True)
        if cards:
            sizes = [c.memory_total for n in nodes for c in n.cards]
        else:
            sizes = [n.memory_total for n in nodes]
        return max(sizes) if sizes else None

    # ------------------------------------------------------------------ showing

    def model_json(self, model: Model) -> dict[str, Any]:
        profiles = []
        ready = starting = stale = 0
        for p in model.profiles:
            status = self.reconciler.status.get((model.name, p.name))
            shown = status.as_json() if status else None
            if status:
                ready += status.ready
                starting += status.starting
                stale += status.stale
            profiles.append(
                {
                    **p.to_spec(),
                    "fingerprint": catalog.fingerprint(model, p),
                    "status": shown,
                    "cpu_tokens_per_second": self.cpu_speed(model, p),
                }
            )
        if model.external:
            return self.external_json(model)
        now = self.reconciler.clock()
        desired = sum(self.reconciler.desired(model, p, now) for p in model.profiles)
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
            "stopped": model.stopped,
            "parked": model.parked,
            "allow_pickle": model.allow_pickle,
            "weight_bytes": model.weight_bytes or None,
            "shape": dict(model.shape),
            "profiles": profiles,
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
        for view in self.cp.registry.nodes.values():
            rate = view.live.get("memory_read_gbs")
            if view.state != "Ready" or not isinstance(rate, int | float):
                continue
            one = view.live.get("memory_read_one_core_gbs")
            speed = modelplan.cpu_tokens_per_second(
                shape, float(rate), threads, float(one) if isinstance(one, int | float) else None
            )
            if speed and (best is None or speed > best):
                best = round(speed, 1)
        return best

    def external_json(self, model: Model) -> dict[str, Any]:
        """An external provider's model: its endpoints by name and weight, never a key."""
        spec = model.external or {}
        gateway = getattr(self.cp, "gateway", None)
        live = {e.replica_id: e for e in gateway.endpoints_of(model.name)} if gateway else {}
        endpoints = []
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
        return {
            "name": model.name,
            "source": spec.get("base_url"),
            "engine": "external",
            "state": "serving" if usable else "unavailable",
            "replicas": len(endpoints),
            "desired": len(endpoints),
            "ready": usable,
            "starting": 0,
            "stale": 0,
            "context": model.context,
            "slots": model.slots,
            "max_output": model.max_output,
            "on_demand": False,
            "stopped": model.stopped,
            "parked": None,
            "allow_pickle": False,
            "weight_bytes": None,
            "shape": {},
            "profiles": [],
            "external": {
                "base_url": spec.get("base_url"),
                "upstream_model": spec.get("upstream_model"),
                "endpoints": endpoints,
            },
        }

    async def add_external(self, body: dict[str, Any], actor: str) -> Model:
        """An OpenAI-compatible provider as a model: its keys sealed in the store."""
        name = body.get("name")
        base_url = body.get("base_url")
        keys = body.get("keys")
        try:
            catalog.check_name(str(name or ""))
        except CatalogError as exc:
            raise _invalid(exc) from None
        assert isinstance(name, str)
        if name in self.models:
            raise Refused(error(409, "exists", f"a model named {name!r} is already in the catalog"))
        if not isinstance(base_url, str) or not _provider_url(base_url):
            raise Refused(
                error(
                    400,
                    "invalid",
                    "base_url: an https:// URL (http:// only to this machine), like "
                    "https://api.example.com/v1",
                    field="base_url",
                )
            )
        if not isinstance(keys, list) or not keys:
            raise Refused(error(400, "invalid", "keys: at least one key", field="keys"))
        sealed = []
        for entry in keys:
            secret = entry.get("key") if isinstance(entry, dict) else None
            weight = entry.get("weight", 1.0) if isinstance(entry, dict) else None
            if not isinstance(secret, str) or not secret.strip():
                raise Refused(error(400, "invalid", "keys: each needs a key", field="keys"))
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
                raise Refused(error(400, "invalid", "keys: a weight must be above 0", field="keys"))
            sealed.append(
                {
                    "sealed": pki.seal(self.cp.cluster_secret, secret.strip().encode()),
                    "weight": float(weight),
                }
            )
        upstream = body.get("upstream_model")
        model = Model(
            name=name,
            source=base_url,
            engine="external",
            profiles=(),
            context=_int(body, "context", catalog.DEFAULT_CONTEXT) or catalog.DEFAULT_CONTEXT,
            max_output=_int(body, "max_output"),
            external={
                "base_url": base_url.rstrip("/"),
                "upstream_model": str(upstream) if upstream else None,
                "keys": sealed,
            },
        )
        detail = f"{base_url}, {len(sealed)} key(s)"
        await self._save(model, Audit(actor, "model.external", name, detail))
        return model

    def explain(self, model: Model) -> list[dict[str, Any]]:
        caps = self.fleet(at_rest=False)
        now = self.reconciler.clock()
        out = []
        strategy: scheduler.Strategy = (
            "spread" if self.cp.config.scheduling.strategy == "spread" else "binpack"
        )
        for profile in model.profiles:
            request = self.reconciler.request(model, profile, now)
            status = self.reconciler.status.get((model.name, profile.name))
            running = sorted(
                {
                    t.node
                    for t in self.reconciler.tracks.values()
                    if t.model == model.name and t.profile == profile.name
                }
            )
            out.append(
                {
                    "model": model.name,
                    "profile": profile.name,
                    "engine": profile.engine,
                    "desired": self.reconciler.desired(model, profile, now),
                    "memory": request.memory,
                    "disk": request.disk,
                    "cpu_cores": request.cpu_cores,
                    "cards": request.cards,
                    "card_memory": request.card_memory,
                    "avoid": sorted(request.avoid),
                    "running_on": running,
                    "note": status.note if status else "",
                    "verdicts": [v.as_json() for v in scheduler.explain(request, caps, strategy)],
                }
            )
        return out

    # ------------------------------------------------------------------ changing

    async def serve(self, body: dict[str, Any], actor: str) -> Model:
        source = body.get("source")
        if not isinstance(source, str) or not source:
            raise Refused(error(400, "bad_request", "source is required", field="source"))
        allow_pickle = bool(body.get("allow_pickle", False))
        try:
            source = catalog.check_source(source, allow_pickle)
            name = catalog.check_name(str(body.get("name") or catalog.default_name(source)))
        except CatalogError as exc:
            raise _invalid(exc) from None
        if name in self.models:
            raise Refused(
                error(
                    409,
                    "exists",
                    f"a model named {name!r} is already in the catalog; change it with "
                    f"`llmgw ctl model ...`, or give another --name",
                    field="name",
                )
            )
        engine = str(body.get("engine") or catalog.default_engine(source))
        if engine not in RULES:
            raise Refused(
                error(
                    400,
                    "invalid",
                    f"engine: unknown engine {engine!r}; llmgw runs {', '.join(sorted(RULES))}",
                    field="engine",
                )
            )
        cards = _int(body, "gpus", 0) or 0
        slots = _int(body, "slots", 1) or 1
        memory = _int(body, "memory")
        args = body.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise Refused(error(400, "bad_request", "args must be a list of strings"))
        selector = body.get("selector") or {}
        if not isinstance(selector, dict):
            raise Refused(error(400, "bad_request", "selector must be an object of labels"))
        shape, why = await self.shape(source, allow_pickle)
        if shape is None and memory is None:
            raise Refused(
                error(
                    400,
                    "cannot_inspect",
                    f"could not read the model's shape ({why}), so its memory cannot be "
                    "estimated; give --memory (per replica, like 8GiB) to serve it anyway",
                    field="source",
                )
            )
        context = _int(body, "context") or catalog.default_context(
            shape, self.largest_room(cards), slots
        )
        profile = Profile(
            name=str(body.get("profile") or "default"),
            engine=engine,
            args=tuple(args),
            cards=cards,
            cpu_cores=_number(body, "cpu_cores"),
            replicas=_int(body, "replicas", 1) or 0,
            priority=_int(body, "priority", 0) or 0,
            selector={str(k): str(v) for k, v in selector.items()},
            role=str(body["role"]) if body.get("role") else None,
            memory=memory or 0,
            memory_set=memory is not None,
        )
        model = Model(
            name=name,
            source=source,
            engine=engine,
            profiles=(profile,),
            context=context,
            slots=slots,
            max_output=_int(body, "max_output"),
            allow_pickle=allow_pickle,
            on_demand=bool(body.get("on_demand", False)),
        )
        try:
            model = catalog.check_model(model, shape)
        except CatalogError as exc:
            raise _invalid(exc) from None
        self.check_fits(model)
        detail = f"{source} engine {engine}, {profile.replicas} replica(s), context {context}"
        await self._save(model, Audit(actor, "model.serve", name, detail))
        return model

    async def change(
        self,
        model: Model,
        changed: Model,
        actor: str,
        action: str,
        detail: str,
        replace_running: bool = False,
    ) -> Model:
        """Check a changed model and keep it; its replicas follow by themselves.
        ``replace_running`` replaces every replica running now, stale ones too."""
        try:
            changed = catalog.check_model(changed, catalog.shape_of(model))
        except CatalogError as exc:
            raise _invalid(exc) from None
        changed = catalog.with_change(model, changed)
        if replace_running:
            running = {
                t.fingerprint
                for t in self.reconciler.tracks.values()
                if t.model == model.name and t.fingerprint
            }
            extra = sorted(running - set(changed.replaced))
            changed = replace(changed, replaced=(*changed.replaced, *extra)[-32:])
        if not changed.stopped:
            self.check_fits(changed)
        self.check_room(model, changed)
        await self._save(changed, Audit(actor, action, model.name, detail))
        return changed

    def pick_profile(self, model: Model, name: str | None, create: bool = False) -> Profile:
        if name:
            found = model.profile(name)
            if found is None and not create:
                known = ", ".join(p.name for p in model.profiles)
                raise Refused(
                    error(
                        404,
                        "not_found",
                        f"{model.name} has no profile {name!r} (it has {known})",
                        field="profile",
                    )
                )
            if found is None:
                try:
                    catalog.check_profile_name(name)
                except CatalogError as exc:
                    raise _invalid(exc) from None
                # A new profile runs on the CPU, below every profile already there.
                return Profile(
                    name=name,
                    engine=model.engine,
                    replicas=0,
                    priority=min(p.priority for p in model.profiles) - 1,
                )
            return found
        if len(model.profiles) == 1:
            return model.profiles[0]
        known = ", ".join(p.name for p in model.profiles)
        raise Refused(
            error(
                400,
                "bad_request",
                f"{model.name} has several profiles ({known}); name one with --profile",
            )
        )

    async def remove(self, model: Model, with_files: bool, actor: str) -> None:
        detail = "with its files" if with_files else ""
        deleted = await self.cp.store.delete_model(
            model.name, Audit(actor, "model.remove", model.name, detail)
        )
        if deleted:
            self.models.pop(model.name, None)
            self.version += 1
            self.wake()
        if with_files:
            task = asyncio.create_task(self._remove_files(model.source))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _remove_files(self, source: str, timeout: float = 120.0) -> None:
        """Once no node runs the source, ask each node to delete its copy."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while source in self.cp.wanted_sources() and loop.time() < deadline:
            await asyncio.sleep(0.5)
        if source in self.cp.wanted_sources():
            log.warning("files of %s kept: a shard still uses them", source)
            return
        for view in list(self.cp.registry.nodes.values()):
            if view.session is None:
                continue
            try:
                names = []
                async for answer in view.session.ask("weights.list", {}):
                    names = [e["name"] for e in answer.result or [] if e.get("source") == source]
                if names:
                    async for answer in view.session.ask("weights.collect", {"names": names}):
                        removed = (answer.result or {}).get("removed", [])
                        await self.cp.store.audit(
                            "reconciler", "weights.remove", view.id, f"{source}: {removed}"
                        )
            except (TimeoutError, ConnectionError) as exc:
                log.warning("could not remove %s from %s: %s", source, view.id, exc)


def routes(cp: ControlPlane, service: ModelService) -> list[Route]:
    def actor(request: Request) -> str:
        host = request.client.host if request.client else "?"
        return f"admin@{host}"

    def found(request: Request) -> Model:
        name = request.path_params["name"]
        model = service.models.get(name)
        if model is None:
            raise Refused(
                error(404, "not_found", f"no model {name!r} in the catalog; see `llmgw ctl models`")
            )
        return model

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if not cp.authorised(request):
                return unauthorised()
            try:
                return await handler(request)
            except Refused as exc:
                return exc.answer

        return run

    async def body_of(request: Request) -> dict[str, Any]:
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            raise Refused(body)
        return body

    async def external(request: Request) -> Response:
        model = await service.add_external(await body_of(request), actor(request))
        return JSONResponse(service.model_json(model), status_code=201)

    async def list_models(request: Request) -> Response:
        return JSONResponse([service.model_json(m) for _, m in sorted(service.models.items())])

    async def serve(request: Request) -> Response:
        model = await service.serve(await body_of(request), actor(request))
        return JSONResponse(service.model_json(model), status_code=201)

    async def show(request: Request) -> Response:
        return JSONResponse(service.model_json(found(request)))

    async def remove(request: Request) -> Response:
        model = found(request)
        with_files = request.query_params.get("with_files") in ("1", "true")
        await service.remove(model, with_files, actor(request))
        return JSONResponse({"name": model.name, "removed": True, "with_files": with_files})

    async def stop(request: Request) -> Response:
        model = found(request)
        changed = await service.change(
            model, replace(model, stopped=True), actor(request), "model.stop", ""
        )
        return JSONResponse(service.model_json(changed))

    async def start(request: Request) -> Response:
        model = found(request)
        service.reconciler.forget_failures(model.name)
        if model.on_demand:
            service.reconciler.want(model.name)
        changed = await service.change(
            model, replace(model, stopped=False, parked=None), actor(request), "model.start", ""
        )
        return JSONResponse(service.model_json(changed))

    async def restart(request: Request) -> Response:
        model = found(request)
        body = await body_of(request) if await request.body() else {}
        changed = replace(
            model, restart=model.restart + 1, in_place=bool(body.get("in_place", False))
        )
        changed = await service.change(
            model, changed, actor(request), "model.restart", "", replace_running=True
        )
        return JSONResponse(service.model_json(changed))

    async def context(request: Request) -> Response:
        model = found(request)
        body = await body_of(request)
        tokens = _int(body, "context")
        slots = _int(body, "slots")
        max_output = _int(body, "max_output")
        if tokens is None and slots is None and max_output is None:
            raise Refused(error(400, "bad_request", "give context, slots or max_output"))
        changed = replace(
            model,
            context=tokens or model.context,
            slots=slots or model.slots,
            max_output=max_output if max_output is not None else model.max_output,
            in_place=bool(body.get("in_place", False)),
        )
        if changed.max_output is not None and changed.max_output > changed.context:
            if max_output is None:
                changed = replace(changed, max_output=changed.context)
        detail = (
            f"context {changed.context}, slots {changed.slots}, max_output {changed.max_output}"
        )
        changed = await service.change(model, changed, actor(request), "model.context", detail)
        return JSONResponse(service.model_json(changed))

    async def gpus(request: Request) -> Response:
        model = found(request)
        body = await body_of(request)
        count = _int(body, "gpus")
        if count is None or count < 0:
            raise Refused(error(400, "bad_request", "gpus: give a number of cards (0 for CPU)"))
        profile = service.pick_profile(model, body.get("profile"))
        new = replace(profile, cards=count)
        if not profile.memory_set:
            new = replace(new, memory=0)
        changed = replace(
            model,
            profiles=tuple(new if p.name == profile.name else p for p in model.profiles),
            in_place=bool(body.get("in_place", False)),
        )
        detail = f"profile {profile.name}: {profile.cards} -> {count} card(s)"
        changed = await service.change(model, changed, actor(request), "model.gpus", detail)
        return JSONResponse(service.model_json(changed))

    async def replicas(request: Request) -> Response:
        model = found(request)
        body = await body_of(request)
        count = _int(body, "replicas")
        if count is None or count < 0:
            raise Refused(error(400, "bad_request", "replicas: give 0 or more"))
        profile = service.pick_profile(model, body.get("profile"), create=True)
        new = replace(profile, replicas=count)
        names = [p.name for p in model.profiles]
        if profile.name in names:
            profiles = tuple(new if p.name == profile.name else p for p in model.profiles)
        else:
            profiles = (*model.profiles, new)
        changed = replace(model, profiles=profiles)
        detail = f"profile {profile.name}: {profile.replicas} -> {count}"
        changed = await service.change(model, changed, actor(request), "model.replicas", detail)
        return JSONResponse(service.model_json(changed))

    async def explain(request: Request) -> Response:
        return JSONResponse(service.explain(found(request)))

    async def demand(request: Request) -> Response:
        model = found(request)
        service.reconciler.want(model.name)
        service.wake()
        return JSONResponse({"name": model.name, "on_demand": model.on_demand})

    async def schedule(request: Request) -> Response:
        node_id = request.path_params["node_id"]
        action = request.url.path.rsplit("/", 1)[1]
        view = cp.registry.nodes.get(node_id)
        if view is None:
            raise Refused(error(404, "not_found", f"no node {node_id!r}; see `llmgw ctl nodes`"))
        labels = dict(view.labels)
        if action == "cordon":
            cordoned, draining = True, view.draining
        elif action == "uncordon":
            cordoned, draining = False, False
        elif action == "drain":
            cordoned, draining = True, True
        elif action == "labels":
            body = await body_of(request)
            for key, value in (body.get("set") or {}).items():
                if not catalog.LABEL.match(str(key)) or not catalog.LABEL.match(str(value)):
                    raise Refused(error(400, "bad_request", f"{key}={value} is not a label"))
                labels[str(key)] = str(value)
            for key in body.get("remove") or []:
                labels.pop(str(key), None)
            cordoned, draining = view.cordoned, view.draining
        else:
            raise Refused(error(404, "not_found", f"no node action {action!r}"))
        await cp.store.set_node_scheduling(
            node_id, cordoned, draining, labels, Audit(actor(request), f"node.{action}", node_id)
        )
        view.cordoned, view.draining, view.labels = cordoned, draining, labels
        service.wake()
        return JSONResponse(view.as_json())

    return [
        Route("/api/v1/models", guarded(list_models)),
        Route("/api/v1/models", guarded(serve), methods=["POST"]),
        Route("/api/v1/models/external", guarded(external), methods=["POST"]),
        Route("/api/v1/models/{name}", guarded(show)),
        Route("/api/v1/models/{name}", guarded(remove), methods=["DELETE"]),
        Route("/api/v1/models/{name}/stop", guarded(stop), methods=["POST"]),
        Route("/api/v1/models/{name}/start", guarded(start), methods=["POST"]),
        Route("/api/v1/models/{name}/restart", guarded(restart), methods=["POST"]),
        Route("/api/v1/models/{name}/context", guarded(context), methods=["POST"]),
        Route("/api/v1/models/{name}/gpus", guarded(gpus), methods=["POST"]),
        Route("/api/v1/models/{name}/replicas", guarded(replicas), methods=["POST"]),
        Route("/api/v1/models/{name}/explain", guarded(explain)),
        Route("/api/v1/models/{name}/demand", guarded(demand), methods=["POST"]),
        *(
            Route(f"/api/v1/nodes/{{node_id}}/{action}", guarded(schedule), methods=["POST"])
            for action in ("cordon", "uncordon", "drain", "labels")
        ),
    ]
