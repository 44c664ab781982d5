"""Models: the catalog as a service, and the loop that makes the nodes run what it says.

``ModelService`` holds the catalog in memory (written through to the store with an
audit entry per change), takes typed requests (``requests.py``) and refuses with
``Refusal``, runs the reconciler on every change and on a timer, and turns its plan
into StartShard and StopShard messages on the agents' streams. Its routes are in
``api/models.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from llmgw import pki
from llmgw.config import SchedulingConfig
from llmgw.modelkit.enginerules import RULES
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog import adapters, scheduler
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.inspector import PickledWeights
from llmgw.server.catalog.model import Adapter, CatalogError, Model, Profile
from llmgw.server.catalog.placement import span_reason
from llmgw.server.catalog.reconciler import Plan, Reconciler, Start
from llmgw.server.fleet.registry import NodeRegistry, NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.requests import (
    AdapterRequest,
    ContextRequest,
    ExternalRequest,
    GpusRequest,
    ReplicasRequest,
    RestartRequest,
    ServeRequest,
)
from llmgw.server.store import Audit, Store, StoreUnavailable
from llmgw.wire.messages import ShardSpec, StartShard, StopShard

log = logging.getLogger("llmgw.models")

# The shape of a model: read on the control plane, else from a node that holds it.
Inspect = Callable[[str, bool], Awaitable[ModelShape]]


def _provider_url(url: str) -> bool:
    """https://, or http:// to this machine only: a key sent in plain text elsewhere
    could be read on the way."""
    from urllib.parse import urlsplit

    from llmgw.modelkit.sources import is_loopback_host

    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and is_loopback_host(parts.hostname)


def _address(view: NodeView | None) -> str:
    """The address the other nodes of a replica reach a node at: the one it reached
    the control plane from."""
    if view is None or not view.address:
        raise RuntimeError("a node of the replica has no known address")
    return view.address


def _invalid(exc: CatalogError) -> Refusal:
    return Refusal(400, "invalid", str(exc), exc.field)


class ModelService:
    def __init__(
        self,
        store: Store,
        registry: NodeRegistry,
        scheduling: SchedulingConfig,
        cluster_secret: bytes,
        inspect: Inspect,
    ) -> None:
        self.store = store
        self.registry = registry
        self.scheduling = scheduling
        self.cluster_secret = cluster_secret
        self.models: dict[str, Model] = {}
        self.reconciler = Reconciler(scheduling)
        self.inspect = inspect
        self._wake = asyncio.Event()
        self.last_plan = Plan()
        self._tasks: set[asyncio.Task[None]] = set()
        # Bumped on every change of the catalog: the gateway rebuilds its routes.
        self.version = 0
        # Reconcile passes made: a test waits for this to move on rather than sleeping.
        self.passes = 0

    async def load(self) -> None:
        self.models.update(await self._stored())

    async def _stored(self) -> dict[str, Model]:
        models: dict[str, Model] = {}
        for record in await self.store.list_models():
            try:
                models[record.name] = Model.from_spec(record.spec)
            except (TypeError, ValueError) as exc:
                log.error("model %s in the store cannot be read (%s); left alone", record.name, exc)
        return models

    async def reload(self) -> None:
        """The store changed under a standby: the catalog as it now says (the routes are
        rebuilt only when it says something new)."""
        models = await self._stored()
        if models != self.models:
            self.models.clear()
            self.models.update(models)
            self.version += 1

    def wake(self) -> None:
        self._wake.set()

    def demand(self, name: str, start: bool) -> None:
        """A client asked for an on-demand model: keep it up, and start it if it is
        at zero (``start``)."""
        self.reconciler.want(name)
        if start:
            self.wake()

    def halt(self, halted: bool) -> None:
        """`llmgw stop` (True): every model goes to zero, the catalog unchanged; False
        undoes it."""
        self.reconciler.halted = halted
        self.version += 1
        self.wake()

    def find(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise Refusal(
                404, "not_found", f"no model {name!r} in the catalog; see `llmgw ctl models`"
            )
        return model

    # ----------------------------------------------------------------- the loop

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.scheduling.interval
        while not stop.is_set():
            try:
                await self.reconcile()
            except StoreUnavailable as exc:
                log.warning("reconcile pass could not write the store (trying again): %s", exc)
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
        nodes = self.registry.nodes
        plan = self.reconciler.plan(list(self.models.values()), nodes)
        self.last_plan = plan
        self.passes += 1
        for stop in plan.stops:
            view = nodes.get(stop.node)
            log.info("stopping %s on %s: %s", stop.replica_id, stop.node, stop.reason)
            if view is not None and view.session is not None:
                await view.session.send(StopShard(replica_id=stop.replica_id))
        for start in plan.starts:
            model = self.models[start.model]
            profile = model.profile(start.profile)
            assert profile is not None
            homes = [nodes.get(n) for n in (start.node, *(w.node for w in start.workers))]
            if any(
                v is None or v.session is None or (start.workers and not v.address) for v in homes
            ):
                track = self.reconciler.tracks.pop(start.replica_id, None)
                if track is not None:
                    self.reconciler.failed(track, self.reconciler.clock(), "node not connected")
                continue
            version = self.reconciler.engine_version(profile.engine)
            for node, spec in self._specs(model, profile, start):
                spec = replace(spec, engine_version=version)
                log.info(
                    "starting %s on %s (port %d%s)",
                    spec.replica_id,
                    node,
                    spec.port,
                    f", cards {', '.join(spec.cards)}" if spec.cards else "",
                )
                session = nodes[node].session
                if session is not None:
                    await session.send(StartShard(spec=spec))
        for name, reason in plan.parks:
            parking = self.models.get(name)
            if parking is not None and not parking.parked:
                log.warning("parking on-demand model %s: %s", name, reason)
                audit = Audit("reconciler", "model.park", name, reason)
                await self._save(replace(parking, parked=reason), audit)
        return plan

    def _specs(self, model: Model, profile: Profile, start: Start) -> list[tuple[str, ShardSpec]]:
        nodes = self.registry.nodes
        where = [start.node, *(w.node for w in start.workers)]
        addresses = {n: _address(nodes.get(n)) for n in where} if start.workers else {}
        return catalog.start_specs(model, profile, start, addresses, self.cluster_secret)

    async def _save(self, model: Model, audit: Audit) -> None:
        await self.store.put_model(model.name, model.to_spec(), audit)
        self.models[model.name] = model
        self.version += 1
        self.wake()

    # ------------------------------------------------------------------ checking

    async def shape(self, source: str, allow_pickle: bool) -> tuple[ModelShape | None, str]:
        try:
            return await self.inspect(source, allow_pickle), ""
        except PickledWeights as exc:
            raise Refusal(400, "invalid", f"source: {exc}", "source") from None
        except Exception as exc:  # any reason it could not be read is said, not raised
            return None, str(exc) or type(exc).__name__

    def fleet(self, at_rest: bool) -> list[scheduler.NodeCapacity]:
        """Nodes as placement sees them now, or empty of replicas and Ready (``at_rest``:
        could this ever fit?)."""
        nodes = self.registry.nodes
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
            # An engine still installing is on its way, not a reason it never fits.
            at_rest = replace(request, avoid=frozenset(), engine_version=None)
            verdicts = scheduler.explain(at_rest, nodes)
            if profile.nodes > 1:
                spans = scheduler.explain_spans(at_rest, nodes)
                if spans and spans[0].ok:
                    continue
                raise Refusal(
                    409,
                    "does_not_fit",
                    f"{model.name} (profile {profile.name}) fits nowhere even with nothing "
                    f"else running: {span_reason(profile.nodes, spans)}",
                    verdicts=[v.as_json() for v in verdicts],
                )
            if any(v.ok for v in verdicts):
                continue
            reasons = "; ".join(f"{v.node}: {', '.join(v.reasons)}" for v in verdicts)
            raise Refusal(
                409,
                "does_not_fit",
                f"{model.name} (profile {profile.name}) fits no node even with nothing "
                f"else running: {reasons}",
                verdicts=[v.as_json() for v in verdicts],
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
            # Room is cards, memory and disk: an engine version still installing is not
            # a lack of room (its replacements wait for it).
            request = replace(self.reconciler.request(changed, profile, 0.0), engine_version=None)
            result = scheduler.place(request, caps)
            if isinstance(result, scheduler.Refusal):
                raise Refusal(
                    409,
                    "no_room",
                    f"no room to start the changed replicas of {model.name} beside the "
                    f"running ones ({result.reason}); add --in-place to stop each "
                    "replica before its replacement starts",
                    verdicts=[v.as_json() for v in result.verdicts],
                )

    def largest_room(self, cards: int) -> int | None:
        nodes = self.fleet(at_rest=True)
        if cards:
            sizes = [c.memory_total for n in nodes for c in n.cards]
        else:
            sizes = [n.memory_total for n in nodes]
        return max(sizes) if sizes else None

    async def add_external(self, ask: ExternalRequest, actor: str) -> Model:
        """An OpenAI-compatible provider as a model: its keys sealed in the store."""
        name = ask.name
        if name in self.models:
            raise Refusal(
                409, "exists", f"a model named {name!r} is already in the catalog", "name"
            )
        self.check_name_free(name)
        if not _provider_url(ask.base_url):
            raise Refusal(
                400,
                "invalid",
                "base_url: an https:// URL (http:// only to this machine), like "
                "https://api.example.com/v1",
                "base_url",
            )
        sealed = []
        for entry in ask.keys:
            secret = entry.key.strip()
            if not secret:
                raise Refusal(400, "invalid", "keys: each needs a key", "keys")
            sealed.append(
                {
                    "sealed": pki.seal(self.cluster_secret, secret.encode()),
                    "weight": entry.weight,
                }
            )
        model = Model(
            name=name,
            source=ask.base_url,
            engine="external",
            profiles=(),
            context=ask.context or catalog.DEFAULT_CONTEXT,
            max_output=ask.max_output,
            external={
                "base_url": ask.base_url.rstrip("/"),
                "upstream_model": ask.upstream_model or None,
                "keys": sealed,
            },
        )
        detail = f"{ask.base_url}, {len(sealed)} key(s)"
        await self._save(model, Audit(actor, "model.external", name, detail))
        return model

    def explain(self, model: Model) -> list[dict[str, Any]]:
        caps = self.fleet(at_rest=False)
        now = self.reconciler.clock()
        out = []
        strategy: scheduler.Strategy = (
            "spread" if self.scheduling.strategy == "spread" else "binpack"
        )
        for profile in model.profiles:
            request = self.reconciler.request(model, profile, now)
            status = self.reconciler.status.get((model.name, profile.name))
            running = sorted(
                {
                    node
                    for t in self.reconciler.tracks.values()
                    if t.model == model.name and t.profile == profile.name
                    for node in t.nodes
                }
            )
            spans = (
                [s.as_json() for s in scheduler.explain_spans(request, caps, strategy)]
                if profile.nodes > 1
                else None
            )
            out.append(
                {
                    "nodes": profile.nodes,
                    "spans": spans,
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

    async def serve(self, ask: ServeRequest, actor: str) -> Model:
        allow_pickle = ask.allow_pickle
        try:
            source = catalog.check_source(ask.source, allow_pickle)
            name = catalog.check_name(ask.name or catalog.default_name(source))
        except CatalogError as exc:
            raise _invalid(exc) from None
        if name in self.models:
            raise Refusal(
                409,
                "exists",
                f"a model named {name!r} is already in the catalog; change it with "
                f"`llmgw ctl model ...`, or give another --name",
                "name",
            )
        self.check_name_free(name)
        engine = ask.engine or catalog.default_engine(source)
        if engine not in RULES:
            raise Refusal(
                400,
                "invalid",
                f"engine: unknown engine {engine!r}; llmgw runs {', '.join(sorted(RULES))}",
                "engine",
            )
        shape, why = await self.shape(source, allow_pickle)
        if shape is None and ask.memory is None:
            raise Refusal(
                400,
                "cannot_inspect",
                f"could not read the model's shape ({why}), so its memory cannot be "
                "estimated; give --memory (per replica, like 8GiB) to serve it anyway",
                "source",
            )
        context = ask.context or catalog.default_context(
            shape, self.largest_room(ask.gpus), ask.slots
        )
        profile = Profile(
            name=ask.profile or "default",
            engine=engine,
            args=ask.args,
            cards=ask.gpus,
            cpu_cores=ask.cpu_cores,
            replicas=ask.replicas,
            priority=ask.priority,
            selector=dict(ask.selector or {}),
            role=ask.role,
            card_class=ask.card_class,
            memory=ask.memory or 0,
            memory_set=ask.memory is not None,
            nodes=ask.nodes,
        )
        model = Model(
            name=name,
            source=source,
            engine=engine,
            profiles=(profile,),
            context=context,
            slots=ask.slots,
            max_output=ask.max_output,
            allow_pickle=allow_pickle,
            on_demand=ask.on_demand,
            kv_events=ask.kv_events,
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

    # ------------------------------------------------------------ the operator's changes

    def served(self, name: str) -> Model:
        """A model llmgw runs itself: an external provider has no replicas or cards."""
        model = self.find(name)
        if model.external:
            raise Refusal(
                400, "invalid", f"{model.name} is an external provider: it has no replicas"
            )
        return model

    async def stop(self, model: Model, actor: str) -> Model:
        return await self.change(model, replace(model, stopped=True), actor, "model.stop", "")

    async def start(self, model: Model, actor: str) -> Model:
        """Start again: un-parks, forgets failures, and an on-demand model is wanted."""
        self.reconciler.forget_failures(model.name)
        if model.on_demand:
            self.reconciler.want(model.name)
        changed = replace(model, stopped=False, parked=None)
        return await self.change(model, changed, actor, "model.start", "")

    async def follow_engine(self, engine: str, detail: str, actor: str) -> list[str]:
        """The fleet runs ``engine`` at another version: every model served by it has its
        replicas replaced, one at a time beside the old (never fewer ready than asked),
        each new one placed where the new version is installed. The models' names."""
        moved: list[str] = []
        for model in list(self.models.values()):
            if model.external or not any(p.engine == engine for p in model.profiles):
                continue
            changed = replace(model, restart=model.restart + 1, in_place=False)
            try:
                await self.change(
                    model, changed, actor, "model.restart", detail, replace_running=True
                )
            except Refusal as exc:
                log.warning("%s keeps its replicas on the old %s: %s", model.name, engine, exc)
                continue
            moved.append(model.name)
        return moved

    async def restart(self, model: Model, ask: RestartRequest, actor: str) -> Model:
        changed = replace(model, restart=model.restart + 1, in_place=ask.in_place)
        return await self.change(model, changed, actor, "model.restart", "", replace_running=True)

    async def set_context(self, model: Model, ask: ContextRequest, actor: str) -> Model:
        if ask.context is None and ask.slots is None and ask.max_output is None:
            raise Refusal(400, "bad_request", "give context, slots or max_output")
        changed = replace(
            model,
            context=ask.context or model.context,
            slots=ask.slots or model.slots,
            max_output=ask.max_output if ask.max_output is not None else model.max_output,
            in_place=ask.in_place,
        )
        if changed.max_output is not None and changed.max_output > changed.context:
            if ask.max_output is None:
                changed = replace(changed, max_output=changed.context)
        detail = (
            f"context {changed.context}, slots {changed.slots}, max_output {changed.max_output}"
        )
        return await self.change(model, changed, actor, "model.context", detail)

    async def set_gpus(self, model: Model, ask: GpusRequest, actor: str) -> Model:
        profile = self.pick_profile(model, ask.profile)
        new = replace(profile, cards=ask.gpus)
        if not profile.memory_set:
            new = replace(new, memory=0)
        changed = replace(
            model,
            profiles=tuple(new if p.name == profile.name else p for p in model.profiles),
            in_place=ask.in_place,
        )
        detail = f"profile {profile.name}: {profile.cards} -> {ask.gpus} card(s)"
        return await self.change(model, changed, actor, "model.gpus", detail)

    async def set_replicas(self, model: Model, ask: ReplicasRequest, actor: str) -> Model:
        profile = self.pick_profile(model, ask.profile, create=True)
        new = replace(profile, replicas=ask.replicas)
        if profile.name in [p.name for p in model.profiles]:
            profiles = tuple(new if p.name == profile.name else p for p in model.profiles)
        else:
            profiles = (*model.profiles, new)
        detail = f"profile {profile.name}: {profile.replicas} -> {ask.replicas}"
        changed = replace(model, profiles=profiles)
        return await self.change(model, changed, actor, "model.replicas", detail)

    def pick_profile(self, model: Model, name: str | None, create: bool = False) -> Profile:
        if name:
            found = model.profile(name)
            if found is None and not create:
                known = ", ".join(p.name for p in model.profiles)
                raise Refusal(
                    404,
                    "not_found",
                    f"{model.name} has no profile {name!r} (it has {known})",
                    "profile",
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
        raise Refusal(
            400,
            "bad_request",
            f"{model.name} has several profiles ({known}); name one with --profile",
            "profile",
        )

    # ------------------------------------------------------------- LoRA adapters

    def check_name_free(self, name: str, adding_to: str | None = None) -> None:
        """Refuse a name clients would ask for that already means another adapter (or,
        for a new adapter of ``adding_to``, a model): one namespace for both."""
        why = adapters.name_taken(self.models, name, adding_to)
        if why is not None:
            raise Refusal(409, "exists", why, "name")

    async def add_adapter(self, model: Model, ask: AdapterRequest, actor: str) -> Model:
        """Every replica loads the new adapter: they are replaced as for any change."""
        changed = adapters.with_adapter(model, Adapter(ask.name, ask.source, ask.scale))
        self.check_name_free(ask.name, adding_to=model.name)
        detail = f"{ask.name} from {ask.source}, scale {ask.scale:g}"
        return await self.change(model, changed, actor, "model.adapter.add", detail)

    async def remove_adapter(self, model: Model, name: str, actor: str) -> Model:
        changed = adapters.without_adapter(model, name)
        return await self.change(model, changed, actor, "model.adapter.remove", name)

    async def remove(self, model: Model, with_files: bool, actor: str) -> None:
        detail = "with its files" if with_files else ""
        deleted = await self.store.delete_model(
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
        while source in self.registry.wanted_sources() and loop.time() < deadline:
            await asyncio.sleep(0.5)
        if source in self.registry.wanted_sources():
            log.warning("files of %s kept: a shard still uses them", source)
            return
        for view in list(self.registry.nodes.values()):
            if view.session is None:
                continue
            try:
                names = []
                async for answer in view.session.ask("weights.list", {}):
                    names = [e["name"] for e in answer.result or [] if e.get("source") == source]
                if names:
                    async for answer in view.session.ask("weights.collect", {"names": names}):
                        removed = (answer.result or {}).get("removed", [])
                        await self.store.audit(
                            "reconciler", "weights.remove", view.id, f"{source}: {removed}"
                        )
            except (TimeoutError, ConnectionError) as exc:
                log.warning("could not remove %s from %s: %s", source, view.id, exc)
