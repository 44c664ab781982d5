"""Models: the catalog as a service.

``ModelService`` holds the catalog in memory (written through to the store with an
audit entry per change, under the caller's ``Principal``), takes typed requests
(``requests.py``) and refuses with ``Refusal``: serving, external providers, every
change of a model (context, cards, replicas, adapters, stop/start/restart), removal and
the fleet's engine versions followed. Whether a model fits is ``Room``'s to judge
(``room.py``); the loop that carries out the reconciler's plan is ``Dispatch``
(``dispatch.py``), which a change wakes. The admin API's routes and the admin pages call
these methods alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from llmgw import pki
from llmgw.config import SchedulingConfig
from llmgw.modelkit.enginerules import RULES
from llmgw.modelkit.finetuned import finetune_name
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog import adapters
from llmgw.server.catalog import model as catalog
from llmgw.server.catalog.dispatch import Dispatch
from llmgw.server.catalog.inspector import PickledWeights
from llmgw.server.catalog.jobs import ServeJobs
from llmgw.server.catalog.jobview import Step
from llmgw.server.catalog.model import Adapter, CatalogError, Model, Profile
from llmgw.server.catalog.reconciler import Plan, Reconciler
from llmgw.server.catalog.room import Room
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.principal import Principal
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
from llmgw.server.store import Audit, Store
from llmgw.tracing import OFF, Tracing
from llmgw.wire.admin.catalog import ExplainJson

log = logging.getLogger("llmgw.models")

# The shape of a model: read on the control plane, else from a node that holds it.
Inspect = Callable[[str, bool], Awaitable[ModelShape]]
RECONCILER = Principal.system("reconciler")


@dataclass(frozen=True)
class CatalogHooks:
    """What the catalog asks of the rest of the control plane."""

    # A model's shape, read from the hub, the control plane's disk or a node.
    inspect: Inspect
    # Ask every node to delete its copy of a source (a model removed with its files).
    remove_files: Callable[[str, Principal], Awaitable[None]]
    # The sha256 of a source's files this control plane vouches for (its mirror's,
    # offline), sent with each start so the node checks what it fetches against them.
    vouched: Callable[[str], dict[str, str]] = lambda source: {}
    # The hub a source's files are sent from (a live mirror), None: the node's own.
    hub_for: Callable[[str], str | None] = lambda source: None
    # Why a fine-tune's stored adapter (``finetune:NAME``) cannot be an adapter of a
    # model (model, NAME), in words; None: it can.
    finetuned: Callable[[str, str], str | None] = lambda model, name: "no fine-tunes here"
    # Where the reconcile passes' and replica starts' spans go.
    tracing: Tracing = OFF


def _provider_url(url: str) -> bool:
    """https://, or http:// to this machine only: a key sent in plain text elsewhere
    could be read on the way."""
    from urllib.parse import urlsplit

    from llmgw.modelkit.sources import is_loopback_host

    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and is_loopback_host(parts.hostname)


def _invalid(exc: CatalogError) -> Refusal:
    return Refusal(400, "invalid", str(exc), exc.field)


def asked(
    ask: ServeRequest,
    name: str,
    source: str,
    engine: str,
    context: int,
    allow_pickle: bool = False,
) -> Model:
    """The model a serve request asks for, one profile, before ``check_model``: what
    ``ModelService.serve`` keeps, and what ``llmgw sim`` places."""
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
        env=dict(ask.env or {}),
    )
    return Model(
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
        allow_image_urls=ask.allow_image_urls,
    )


class ModelService:
    def __init__(
        self,
        store: Store,
        registry: NodeRegistry,
        reconciler: Reconciler,
        scheduling: SchedulingConfig,
        cluster_secret: bytes,
        wake: asyncio.Event,
        hooks: CatalogHooks,
    ) -> None:
        """``wake`` is the reconcile loop's: set on every change (the registry sets it
        too, on every report that matters)."""
        self.store = store
        self.registry = registry
        self.reconciler = reconciler
        self.cluster_secret = cluster_secret
        self.hooks = hooks
        self.models: dict[str, Model] = {}
        self.room = Room(reconciler, registry, scheduling)
        self._wake = wake
        self.dispatch = Dispatch(
            reconciler,
            registry,
            self.models,
            cluster_secret,
            scheduling,
            wake,
            self.park,
            vouched=hooks.vouched,
            hub_for=hooks.hub_for,
            tracing=hooks.tracing,
        )
        # What each serve started, followed until its replicas answer (``jobs.py``).
        self.jobs = ServeJobs(store, reconciler, registry, self.models)
        self._tasks: set[asyncio.Task[None]] = set()
        # Bumped on every change of the catalog: the gateway rebuilds its routes.
        self.version = 0

    @property
    def passes(self) -> int:
        """Reconcile passes made here: a test waits for this to move on rather than
        sleeping; none on a standby."""
        return self.dispatch.passes

    @property
    def last_plan(self) -> Plan:
        return self.dispatch.last_plan

    async def run(self, stop: asyncio.Event) -> None:
        """The reconcile loop, and the serve jobs followed, while this control plane
        leads."""
        try:
            await asyncio.gather(self.dispatch.run(stop), self.jobs.run(stop))
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def reconcile(self) -> Plan:
        """One pass now."""
        return await self.dispatch.reconcile()

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
        self.reconciler.halt(halted)
        self.version += 1
        self.wake()

    def find(self, name: str) -> Model:
        model = self.models.get(name)
        if model is None:
            raise Refusal(
                404, "not_found", f"no model {name!r} in the catalog; see `llmgw ctl models`"
            )
        return model

    async def _save(self, model: Model, audit: Audit) -> None:
        await self.store.put_model(model.name, model.to_spec(), audit)
        self.models[model.name] = model
        self.version += 1
        self.wake()

    async def park(self, name: str, reason: str) -> None:
        """An on-demand model that keeps failing is parked until started again."""
        parking = self.models.get(name)
        if parking is not None and not parking.parked:
            log.warning("parking on-demand model %s: %s", name, reason)
            audit = Audit(RECONCILER.name, "model.park", name, reason)
            await self._save(replace(parking, parked=reason), audit)

    # ------------------------------------------------------------------ checking

    async def shape(self, source: str, allow_pickle: bool) -> tuple[ModelShape | None, str]:
        try:
            return await self.hooks.inspect(source, allow_pickle), ""
        except PickledWeights as exc:
            raise Refusal(400, "invalid", f"source: {exc}", "source") from None
        except Exception as exc:  # any reason it could not be read is said, not raised
            return None, str(exc) or type(exc).__name__

    async def add_external(self, ask: ExternalRequest, by: Principal) -> Model:
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
        await self._save(model, Audit(by.name, "model.external", name, detail))
        return model

    # ------------------------------------------------------------------ changing

    async def serve(self, ask: ServeRequest, by: Principal) -> Model:
        model, _ = await self.serve_job(ask, by)
        return model

    async def serve_job(self, ask: ServeRequest, by: Principal) -> tuple[Model, str]:
        """Serve, and the id of the job that follows it up (``GET /api/v1/jobs/{id}``):
        resolve and plan are done here, refused at once when they fail; the job goes on
        with place, fetch, start and ready."""
        resolve = Step("resolve", "running", self.jobs.wall())
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
        resolve.state, resolve.ended = "done", self.jobs.wall()
        resolve.detail = f"{source}, engine {engine}" + (
            f", {shape.file_bytes / 2**30:.2f} GiB of weights"
            if shape is not None and shape.file_bytes
            else ""
        )
        plan = Step("plan", "running", resolve.ended)
        context = ask.context or catalog.default_context(
            shape, self.room.largest(ask.gpus), ask.slots
        )
        model = asked(ask, name, source, engine, context, allow_pickle)
        profile = model.profiles[0]
        try:
            model = catalog.check_model(model, shape)
        except CatalogError as exc:
            raise _invalid(exc) from None
        self.room.check_fits(model)
        detail = f"{source} engine {engine}, {profile.replicas} replica(s), context {context}"
        await self._save(model, Audit(by.name, "model.serve", name, detail))
        plan.state, plan.ended = "done", self.jobs.wall()
        plan.detail = f"{profile.replicas} replica(s), context {context}, fits"
        job = await self.jobs.begin(model, [resolve, plan])
        return model, job.id

    async def change(
        self,
        model: Model,
        changed: Model,
        by: Principal,
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
            running = self.reconciler.running_fingerprints(model.name)
            extra = sorted(running - set(changed.replaced))
            changed = replace(changed, replaced=(*changed.replaced, *extra)[-32:])
        if not changed.stopped:
            self.room.check_fits(changed)
        self.room.check_room(model, changed)
        await self._save(changed, Audit(by.name, action, model.name, detail))
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

    async def stop(self, model: Model, by: Principal) -> Model:
        return await self.change(model, replace(model, stopped=True), by, "model.stop", "")

    async def start(self, model: Model, by: Principal) -> Model:
        """Start again: un-parks, forgets failures, and an on-demand model is wanted."""
        self.reconciler.forget_failures(model.name)
        if model.on_demand:
            self.reconciler.want(model.name)
        changed = replace(model, stopped=False, parked=None)
        return await self.change(model, changed, by, "model.start", "")

    async def follow_engine(self, engine: str, detail: str, by: Principal) -> list[str]:
        """The fleet runs ``engine`` at another version: every model served by it has its
        replicas replaced, one at a time beside the old (never fewer ready than asked),
        each new one placed where the new version is installed. The models' names."""
        moved: list[str] = []
        for model in list(self.models.values()):
            if model.external or not any(p.engine == engine for p in model.profiles):
                continue
            changed = replace(model, restart=model.restart + 1, in_place=False)
            try:
                await self.change(model, changed, by, "model.restart", detail, replace_running=True)
            except Refusal as exc:
                log.warning("%s keeps its replicas on the old %s: %s", model.name, engine, exc)
                continue
            moved.append(model.name)
        return moved

    async def restart(self, model: Model, ask: RestartRequest, by: Principal) -> Model:
        changed = replace(model, restart=model.restart + 1, in_place=ask.in_place)
        return await self.change(model, changed, by, "model.restart", "", replace_running=True)

    async def set_context(self, model: Model, ask: ContextRequest, by: Principal) -> Model:
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
        return await self.change(model, changed, by, "model.context", detail)

    async def set_gpus(self, model: Model, ask: GpusRequest, by: Principal) -> Model:
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
        return await self.change(model, changed, by, "model.gpus", detail)

    async def set_replicas(self, model: Model, ask: ReplicasRequest, by: Principal) -> Model:
        profile = self.pick_profile(model, ask.profile, create=True)
        new = replace(profile, replicas=ask.replicas)
        if profile.name in [p.name for p in model.profiles]:
            profiles = tuple(new if p.name == profile.name else p for p in model.profiles)
        else:
            profiles = (*model.profiles, new)
        detail = f"profile {profile.name}: {profile.replicas} -> {ask.replicas}"
        changed = replace(model, profiles=profiles)
        return await self.change(model, changed, by, "model.replicas", detail)

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

    async def add_adapter(self, model: Model, ask: AdapterRequest, by: Principal) -> Model:
        """Every replica loads the new adapter: they are replaced as for any change."""
        changed = adapters.with_adapter(model, Adapter(ask.name, ask.source, ask.scale))
        self.check_name_free(ask.name, adding_to=model.name)
        try:
            trained = finetune_name(ask.source)
        except ValueError as exc:
            raise Refusal(400, "invalid", str(exc), "source") from None
        why = self.hooks.finetuned(model.name, trained) if trained is not None else None
        if why is not None:
            raise Refusal(409, "not_trained", why, "source")
        detail = f"{ask.name} from {ask.source}, scale {ask.scale:g}"
        return await self.change(model, changed, by, "model.adapter.add", detail)

    async def remove_adapter(self, model: Model, name: str, by: Principal) -> Model:
        changed = adapters.without_adapter(model, name)
        return await self.change(model, changed, by, "model.adapter.remove", name)

    async def remove(self, model: Model, with_files: bool, by: Principal) -> None:
        detail = "with its files" if with_files else ""
        deleted = await self.store.delete_model(
            model.name, Audit(by.name, "model.remove", model.name, detail)
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
        await self.hooks.remove_files(source, RECONCILER)

    def explain(self, model: Model) -> list[ExplainJson]:
        """``ctl explain``: every node's verdict for each profile."""
        return self.room.explain(model)
