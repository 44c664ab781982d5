"""The OpenAI-compatible gateway: ``/v1`` for every client of the cluster.

A request's life: the key looked up in memory (a SHA-256 of what the client sent) →
the body read within its size and time limits and checked field by field
(``checks.py``) → its key's limits → the body's ``model`` mapped to its replicas and
one chosen (``router.py``), after a fair turn in the model's queue when every replica is
at its slots (``queue.py``) → the request sent with the replica's engine key and the
answer passed back, a stream event by event (``proxy.py``) → its tokens counted for
the key (``limits.py``) and the metrics. Every failure is OpenAI's error shape,
``{"error": {"message", "type", "param", "code"}}``.

Everything here runs on aiohttp's own request and response objects: the gateway is
where llmgw must add the least to each request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from llmgw.config import GatewayConfig
from llmgw.enginefamilies import scrape
from llmgw.jsonvalue import JSONObject
from llmgw.server.catalog.model import Model
from llmgw.server.gateway import checks, kvroute
from llmgw.server.gateway.adapters import AdapterBook, Asked, refuse_client_lora
from llmgw.server.gateway.checks import Bounds, Kind, Rejected
from llmgw.server.gateway.errors import JSON, bad_request, fail, refused, stream_error
from llmgw.server.gateway.imagefetch import ImageFetcher
from llmgw.server.gateway.images import ImageRules, image_parts, prepare_images
from llmgw.server.gateway.kvroute import KvIndex
from llmgw.server.gateway.limits import Key, KeyBook, Usage, UsageWriter
from llmgw.server.gateway.metrics import Metrics, resume_lines, routing_lines
from llmgw.server.gateway.probe import EngineProbe
from llmgw.server.gateway.proxy import GUARD_FLAG, GUARD_HEADER, Trace, Upstream
from llmgw.server.gateway.queue import FairQueue
from llmgw.server.gateway.router import Catalog, Endpoint, Nodes, Router
from llmgw.server.gateway.spans import traced
from llmgw.server.people.directory import Snapshot
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store, StoreUnavailable
from llmgw.tracing import OFF, Tracing

log = logging.getLogger("llmgw.gateway")

# How often each key's tokens this month are read again from the store.
BUDGETS_EVERY = 30.0
# A stream waiting for an on-demand model's first replica gets a comment this often.
KEEPALIVE = 10.0
ROUTES: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
# The model is wanted now (``start``: and a replica should start if it has none).
Demand = Callable[[str, bool], None]


class PromptGuard(Protocol):
    """The guard (``server/guard/``) as ``/v1`` asks it, for keys with policies only."""

    async def prompt(self, key: Key, body: JSONObject) -> str | None:
        """Read the request's text, rewriting it in place where a policy redacts or
        withholds; raise ``Refusal`` where one refuses it; the header's value when one
        flagged it."""
        ...

    def metric_lines(self) -> list[str]: ...


class ToolDoor(Protocol):
    """``POST /mcp`` on the gateway's listener (``server/mcp/gateway.py``), for a key
    already authorised, and its metric families."""

    async def handle(self, request: web.BaseRequest, key: Key) -> web.StreamResponse: ...

    def metric_lines(self) -> list[str]: ...


def bounds_of(config: GatewayConfig) -> Bounds:
    return Bounds(
        max_body=config.max_body,
        max_depth=config.max_depth,
        max_messages=config.max_messages,
        max_prompt_chars=config.max_prompt_chars,
    )


class Gateway:
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        catalog: Catalog,
        secret: bytes,
        config: GatewayConfig,
        demand: Demand,
        clock: Callable[[], float] = time.time,
        kv: KvIndex | None = None,
        write_usage: UsageWriter | None = None,
        tree: Callable[[], Snapshot] = Snapshot,
        guard: PromptGuard | None = None,
        mcp: ToolDoor | None = None,
        tracing: Tracing = OFF,
    ) -> None:
        """``kv``: the replicas' cached blocks (the registry feeds it from the agents'
        reports); ``write_usage``: where counted usage goes (the store when not given);
        ``tree``: the organisations, teams and projects whose limits keys are under;
        ``guard``: what reads the prompts of keys with guard policies;
        ``mcp``: what answers ``/mcp``; ``tracing``: where each request's span goes."""
        self.mcp = mcp
        self.tracing = tracing
        self.store = store
        self.catalog = catalog
        self.guard = guard
        self.config = config
        self.bounds = bounds_of(config)
        self.adapters = AdapterBook(catalog)
        # A request for an adapter wants its model up.
        self.demand = self.adapters.demand_of(demand)
        self.usage = Usage(store, clock, write_usage)
        self.keys = KeyBook(self.usage, clock, tree)
        self.probe = EngineProbe(nodes, secret)
        self.router = Router(nodes, catalog, self.probe, secret, kv=kv)
        self.metrics = Metrics()
        self.queue = FairQueue(
            self.router.room, config.queue_wait, config.queue_depth, self.metrics.queued
        )
        # A slot a request frees is its model's adapters' as much (the same replicas).
        released = self.adapters.released_to(self.queue.released)
        self.upstream = Upstream(self.router, config.request_timeout, released)
        # Image URLs of models that allow them, fetched under the SSRF rules.
        self.images = ImageFetcher(
            config.image_max_bytes, config.image_fetch_timeout, config.image_urls_private
        )
        # `llmgw stop` (the ServingSwitch, keyservice.py, sets it): /v1 refuses.
        self.stopped = False
        self.requests = 0
        # A control plane just started does not know yet what its agents run: until
        # ``config.start_wait`` after this, a request with no replica waits for one.
        self.started = time.monotonic()

    # ------------------------------------------------------------------ state

    def halt(self, stopped: bool) -> None:
        """``llmgw stop`` (True): /v1 refuses every request; False serves again."""
        self.stopped = stopped

    async def load(self) -> None:
        self.keys.load(await self.store.list_api_keys())
        await self.usage.load_month()

    async def flush(self) -> None:
        await self.usage.flush()

    async def take_usage(self, rows: list[tuple[str, str, str, str, int, int, int]]) -> None:
        """Usage a standby counted, sent to this leader: into the store, and into each
        key's spending here."""
        await self.store.add_usage(rows)
        for _, key_id, _, _, _, prompt, completion in rows:
            self.keys.used(key_id, prompt + completion)

    async def run(self, stop: asyncio.Event) -> None:
        """Write usage every two seconds (kept and retried while the store cannot take
        it; a standby sends it to the leader), and read the month's again every 30 s."""
        read_month = time.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=2.0)
            except TimeoutError:
                pass
            try:
                await self.usage.tick()
                if time.monotonic() - read_month >= BUDGETS_EVERY:
                    # Budgets are the cluster's: what every control plane counted.
                    read_month = time.monotonic()
                    await self.usage.load_month()
            except StoreUnavailable:
                pass  # said once by the store; the usage is kept and written later
            except Exception:
                log.exception("could not write usage (kept, retried in 2 s)")

    async def probe_engines(self, stop: asyncio.Event) -> None:
        """Probe the engines of silent agents: every control plane that serves /v1."""
        await self.probe.run(self.upstream.session, stop)

    async def close(self) -> None:
        await self.upstream.close()
        await self.images.close()

    def endpoints_of(self, model: str) -> list[Endpoint]:
        return self.router.endpoints_of(model)

    # --------------------------------------------------------------- requests

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if self.tracing.enabled:  # off: not a span object made, not a module imported
            return await traced(self.tracing, request, self._answer)
        return await self._answer(request, Trace(time.perf_counter()))

    async def _answer(self, request: web.BaseRequest, trace: Trace) -> web.StreamResponse:
        try:
            response = await self._handle(request, trace)
        except Exception:
            # A failure of the gateway itself: said in the client's shape, logged whole.
            log.exception("%s %s failed", request.method, request.path)
            response = fail(
                500, "the gateway failed on this request", "api_error", "internal_error"
            )
        self.metrics.request(
            trace.model,
            response.status,
            time.perf_counter() - trace.start,
            trace.first - trace.start if trace.first else None,
        )
        return response

    async def metrics_text(self) -> str:
        """``/metrics``: the gateway's counters and every Ready replica's own."""
        inflight: dict[tuple[str, str], int] = {}
        targets: list[tuple[str, str, str, str]] = []
        for model, endpoints in self.router.table().items():
            for e in endpoints:
                inflight[(model, e.replica_id)] = e.outstanding
                if not e.external:
                    targets.append((model, e.replica_id, e.url[:-3] + "/metrics", e.key))
        engines = await scrape(self.upstream.session, targets)
        router = self.router
        kv_blocks = {
            (model, e.replica_id): len(held.blocks)
            for model, endpoints in router.table().items()
            for e in endpoints
            if e.kv and (held := router.kv.held(e.replica_id)) is not None
        }
        routing = routing_lines(
            router.decisions, router.kv_hits, kv_blocks, router.tokenize_failures
        )
        resumes = self.upstream.resumes
        return self.metrics.render(
            inflight,
            self.router.prefix_hits,
            # The router's families, streams continued, the guard's, then the engines' own.
            [
                *routing,
                *resume_lines(resumes.resumed, resumes.failed),
                *(self.guard.metric_lines() if self.guard is not None else ()),
                *(self.mcp.metric_lines() if self.mcp is not None else ()),
                *engines,
            ],
            failures=self.router.failures,
            breaker_opens=self.router.breaker_opens,
            vouched={
                (model, e.replica_id): int(e.vouched)
                for model, endpoints in self.router.table().items()
                for e in endpoints
                if not e.external
            },
            queue_depth={
                **{m: 0 for m, endpoints in self.router.table().items() if endpoints},
                **self.queue.depths(),
            },
        )

    async def _handle(self, request: web.BaseRequest, trace: Trace) -> web.StreamResponse:
        self.requests += 1
        key = self.keys.authorise(request.headers.get("Authorization", ""))
        if isinstance(key, web.Response):
            return key
        path = request.path
        if path == "/mcp" and self.mcp is not None:
            return await self.mcp.handle(request, key)
        if path == "/v1/models" and request.method == "GET":
            return self.list_models(key)
        kind = ROUTES.get(path)
        if kind is None:
            return fail(
                404, f"no route {request.method} {path}", "invalid_request_error", "not_found"
            )
        if request.method != "POST":
            return fail(405, f"{path} takes POST", "invalid_request_error", "method_not_allowed")
        if self.stopped:
            return fail(
                503,
                "serving is stopped on this cluster (`llmgw start` resumes it)",
                "service_unavailable",
                "system_stopped",
            )
        raw = await self._read_body(request)
        if isinstance(raw, web.Response):
            return raw
        try:
            body = checks.parse(raw, self.bounds)
            name = checks.check(kind, body, self.bounds)
            refuse_client_lora(body)
        except Rejected as exc:
            return bad_request(exc.message, exc.code, exc.param)
        model = self.catalog.models.get(name)
        asked = self.adapters.find(name) if model is None else None
        if asked is not None:  # a LoRA adapter: its model's replicas, under its own name
            model, name = asked.model, asked.name
        if model is None or not key.may_use(name):
            return fail(
                404,
                f"the model '{name}' does not exist or you do not have access to it",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        trace.model = name  # a catalog model: labels stay bounded
        if model.stopped:
            return fail(
                503,
                f"the model '{name}' is stopped (`llmgw ctl model start {model.name}`)",
                "service_unavailable",
                "model_stopped",
            )
        limited = self.keys.over_limit(key)
        if limited is not None:
            return limited
        if kind == "chat" and image_parts(body):
            # After the key's limits: a key over them makes the gateway fetch nothing.
            try:
                if await prepare_images(body, self._image_rules(model, name), self.images):
                    raw = json.dumps(body).encode()
            except Rejected as exc:
                return bad_request(exc.message, exc.code, exc.param)
        flagged = guarded = None
        if key.policies and self.guard is not None and kind != "embedding":
            # Only a key with policies comes here: one without costs nothing.
            try:
                flagged = await self.guard.prompt(key, body)
            except Refusal as exc:
                return refused(exc)
            guarded = True
            if flagged is not None:
                request[GUARD_FLAG] = flagged  # the stream's head says it (proxy.py)
        stream = kind != "embedding" and body.get("stream") is True
        strip_usage = False
        if kind != "embedding":
            checks.hold_to(body, model.max_output)
            if stream:
                strip_usage = not checks.ask_for_usage(body)
            if stream or model.max_output is not None or guarded:
                # What the engine reads is what was checked, whatever its JSON reader.
                raw = json.dumps(body).encode()
        prefix = self.router.prefix_of(name, body) if kind != "embedding" else []
        blocks = None
        sizes = self.router.kv_sizes(name) if kind != "embedding" else None
        if sizes:
            # Only a model whose replicas report their cache has its prompt tokenized.
            blocks = await self.cache_blocks(name, body, sizes, asked is not None)
        try:
            # Every replica at its slots: wait a turn, fair across keys (queue.py).
            endpoint = await self.queue.admit(
                name,
                key.record.id,
                key.record.priority,
                lambda: self.router.pick(name, prefix=prefix, blocks=blocks, room=True),
            )
        except Refusal as exc:
            return refused(exc)
        if endpoint is None and model.on_demand and stream:
            return await self.stream_when_ready(
                request, path, raw, name, key, trace, strip_usage, asked
            )
        if endpoint is None:
            endpoint = await self.wait_for_replica(name, model.on_demand)
            if endpoint is None:
                return fail(
                    503,
                    f"the model '{name}' has no Ready replica now; `llmgw ctl models` says why",
                    "service_unavailable",
                    "no_replica",
                )
        elif model.on_demand:
            self.demand(name, False)
        self.keys.admitted(key)
        answer = await self.upstream.send(
            request,
            path,
            raw,
            name,
            endpoint,
            trace,
            stream,
            strip_usage,
            self._recorder(key, name, trace),
            adapter=asked,
        )
        if flagged is not None and not answer.prepared:
            answer.headers[GUARD_HEADER] = flagged
        return answer

    def _image_rules(self, model: Model, name: str) -> ImageRules:
        said = [e.vision for e in self.router.serving(name) if e.vision is not None]
        return ImageRules(
            model=name,
            vision=any(said) if said else None,
            allow_urls=model.allow_image_urls,
            max_bytes=self.config.image_max_bytes,
        )

    async def _read_body(self, request: web.BaseRequest) -> bytes | web.Response:
        """The body, refused past ``max_body`` (before reading when it says its length)
        or when it does not arrive within ``body_timeout``."""
        limit = self.bounds.max_body
        length = request.content_length
        if length is not None and length > limit:
            return _too_large(limit)
        content = request.content
        if length is not None and content.is_eof():
            return await content.read()  # all here already: the common case, no timer
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.body_timeout):
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > limit:
                        return _too_large(limit)
                    chunks.append(chunk)
        except TimeoutError:
            late = fail(
                408,
                f"the request body did not arrive within {self.config.body_timeout:g} s",
                "invalid_request_error",
                "body_timeout",
            )
            late.force_close()
            return late
        return b"".join(chunks)

    def _recorder(self, key: Key, model: str, trace: Trace) -> Callable[[str, int, int], None]:
        def record(replica: str, prompt: int, completion: int) -> None:
            trace.used(prompt, completion)
            self.usage.add(key, model, replica, prompt, completion)
            self.metrics.add_tokens(model, prompt, completion)
            if completion:
                where = (model, replica)
                answered = self.metrics.replica_tokens
                answered[where] = answered.get(where, 0) + completion

        return record

    async def cache_blocks(
        self, name: str, body: JSONObject, sizes: set[int], adapter: bool = False
    ) -> dict[int, list[int]] | None:
        """A prompt's KV-cache block hashes in each of ``sizes`` (the block sizes of the
        replicas of a model, or of one of its adapters, that report their cache): its
        tokens from the least busy such replica's tokenizer, hashed as vLLM does. None
        (route without them) when none is ready, or the tokenizer fails."""
        request = kvroute.tokenize_body(body)
        now = time.monotonic()
        ready = [e for e in self.router.serving(name) if e.kv and e.open_until <= now]
        if request is None or not ready:
            return None
        teller = min(ready, key=lambda e: e.outstanding)
        request["model"] = name  # as vLLM serves it: the model's or the adapter's own name
        tokens = await kvroute.tokenize(self.upstream.session, teller.url, teller.key, request)
        if tokens is None:
            self.router.tokenize_failures += 1
            return None
        return kvroute.prompt_hashes(tokens, sizes, name if adapter else None)

    async def wait_for_replica(self, model: str, on_demand: bool) -> Endpoint | None:
        """A replica for a request that found none: an on-demand model's first one,
        started for it; else, in the first seconds after the control plane started, one
        its agents report again as they register (or the probe proves remembered)."""
        if on_demand:
            self.demand(model, True)
            deadline = time.monotonic() + self.config.on_demand_wait
        else:
            deadline = self.started + self.config.start_wait
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            endpoint = self.router.pick(model)
            if endpoint is not None:
                return endpoint
        return None

    def list_models(self, key: Key) -> web.Response:
        data: list[JSONObject] = [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "llmgw"}
            for name, m in sorted(self.catalog.models.items())
            if key.may_use(name)
        ]
        for entry in data:
            if any(e.vision for e in self.router.serving(str(entry["id"]))):
                entry["capabilities"] = ["vision"]
        data += self.adapters.listing(key.may_use)
        return web.Response(
            body=json.dumps({"object": "list", "data": data}).encode(), content_type=JSON
        )

    async def stream_when_ready(
        self,
        request: web.BaseRequest,
        path: str,
        raw: bytes,
        model: str,
        key: Key,
        trace: Trace,
        strip_usage: bool,
        adapter: Asked | None = None,
    ) -> web.StreamResponse:
        """A stream asked of an on-demand model at zero: the stream begins at once and a
        comment line every KEEPALIVE seconds keeps the connection (and its proxies)
        alive while a replica starts; then the replica's stream follows."""
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        flagged = request.get(GUARD_FLAG)
        if flagged is not None:
            response.headers[GUARD_HEADER] = flagged
        await response.prepare(request)
        self.demand(model, True)
        deadline = time.monotonic() + self.config.on_demand_wait
        said = 0.0
        endpoint = self.router.pick(model)
        while endpoint is None:
            now = time.monotonic()
            if now > deadline:
                await stream_error(
                    response, f"no replica of '{model}' started in time", "no_replica"
                )
                return response
            if now - said >= KEEPALIVE:
                await response.write(f": llmgw: starting a replica of {model}\n\n".encode())
                said = now
            await asyncio.sleep(0.25)
            endpoint = self.router.pick(model)
        self.keys.admitted(key)
        answer = await self.upstream.send(
            request,
            path,
            raw,
            model,
            endpoint,
            trace,
            True,
            strip_usage,
            self._recorder(key, model, trace),
            prepared=response,
            adapter=adapter,
        )
        if answer is not response:
            # No replica's stream began (each failed, or the request was refused): say
            # so in the stream, in the words of the answer it would have had.
            await stream_error(response, _message_of(answer), "upstream_error")
        return response


def _too_large(limit: int) -> web.Response:
    answer = bad_request(
        f"the request body is over {limit // 2**20} MiB (gateway.max_body); send less",
        "body_too_large",
    )
    answer.force_close()
    return answer


def _message_of(answer: web.StreamResponse) -> str:
    body = answer.body if isinstance(answer, web.Response) else None
    try:
        error = json.loads(body)["error"] if isinstance(body, bytes) else None
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return f"the replica answered {answer.status} before its stream began"
