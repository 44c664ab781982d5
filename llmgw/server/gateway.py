"""The OpenAI-compatible gateway: ``/v1`` for every client of the cluster.

A request's life: the key looked up in memory (a SHA-256 of what the client sent) →
its limits → the body's ``model`` mapped to that model's Ready replicas → a replica
chosen (the highest-priority pool that has one, least outstanding requests within
it) → the request proxied over a pooled aiohttp session with the replica's engine key
→ the answer passed back, a stream chunk by chunk. A replica that refuses the
connection or answers 5xx before any byte reached the client is retried once on
another; one that keeps failing is taken out for a while by its breaker. Every failure
is OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``.

Everything here runs on aiohttp's own request and response objects: the gateway is
where llmgw must add the least to each request.
"""

from __future__ import annotations

import asyncio
import calendar
import fnmatch
import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from llmgw import pki
from llmgw.server.catalog import Model, parse_replica_id
from llmgw.server.metrics import Metrics, scrape
from llmgw.server.store import ApiKeyRecord

if TYPE_CHECKING:
    from llmgw.server.controlplane import ControlPlane

log = logging.getLogger("llmgw.gateway")

MAX_BODY = 32 * 1024 * 1024
KEY_PREFIX = "sk-llmgw-"
STOPPED_SETTING = "serving.stopped"
# A replica failing this many times in a row is passed over for BREAKER_OPEN seconds.
BREAKER_FAILURES = 3
BREAKER_OPEN = 10.0
# A stream waiting for an on-demand model's first replica gets a comment this often.
KEEPALIVE = 10.0
# Prefix affinity: prompts are hashed in blocks of this many characters; a replica is
# affine when it likely holds at least PREFIX_MIN_BLOCKS of them, and chosen unless it
# has more than PREFIX_SLACK requests outstanding beyond the least busy.
PREFIX_BLOCK = 256
PREFIX_MIN_BLOCKS = 2
PREFIX_SLACK = 4
PREFIX_MEMORY = 4096
_JSON = "application/json"
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "date",
        "server",
    }
)
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def fail(
    status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> web.Response:
    """OpenAI's error shape."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.Response(status=status, body=json.dumps(body).encode(), content_type=_JSON)


class Window:
    """Counts over the last 60 seconds in one-second buckets: exact to the second."""

    __slots__ = ("buckets", "total")

    def __init__(self) -> None:
        self.buckets: deque[list[int]] = deque()
        self.total = 0

    def _trim(self, now: int) -> None:
        while self.buckets and self.buckets[0][0] <= now - 60:
            self.total -= self.buckets.popleft()[1]

    def count(self, now: float) -> int:
        self._trim(int(now))
        return self.total

    def add(self, now: float, n: int) -> None:
        second = int(now)
        self._trim(second)
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += n
        else:
            self.buckets.append([second, n])
        self.total += n

    def retry_after(self, now: float, limit: int) -> int:
        """Seconds until the window holds less than ``limit``."""
        total = self.total
        for second, n in self.buckets:
            total -= n
            if total < limit:
                return max(1, second + 60 - int(now))
        return 60


@dataclass
class Key:
    record: ApiKeyRecord
    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)

    def may_use(self, model: str) -> bool:
        patterns = self.record.models
        return not patterns or any(fnmatch.fnmatchcase(model, p) for p in patterns)


@dataclass
class Endpoint:
    """One Ready replica as the router sees it."""

    replica_id: str
    url: str
    key: str
    priority: int
    outstanding: int = 0
    failures: int = 0
    open_until: float = 0.0
    weight: float = 1.0
    # An external provider's key: its answers are judged by key (429, 401).
    external: bool = False
    upstream_model: str | None = None
    # Why this endpoint is passed over now, in words (never the key).
    problem: str = ""
    # Hashes of the prompt prefixes sent here lately, oldest first: what its cache
    # likely holds. Approximate on purpose: a miss costs a prefill, not a wrong answer.
    prefixes: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt this replica likely holds."""
        lo, hi = 0, len(hashes)
        while lo < hi:  # prefixes nest: if block k is held, so are those before it
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in self.prefixes:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def remember(self, hashes: Sequence[int]) -> None:
        prefixes = self.prefixes
        for h in hashes:
            prefixes[h] = None
            prefixes.move_to_end(h)
        while len(prefixes) > PREFIX_MEMORY:
            prefixes.popitem(last=False)


def prompt_prefix(body: dict[str, Any]) -> list[int]:
    """Hashes of a prompt's leading blocks (each hash covers every block before it);
    empty for a prompt too short to be worth routing by."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            parts.append(f"{m.get('role')}\x00{content}")
        text = "\x01".join(parts)
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        return []
    blocks = len(text) // PREFIX_BLOCK
    if blocks < PREFIX_MIN_BLOCKS:
        return []
    out, h = [], 0
    for i in range(blocks):
        h = hash((h, text[i * PREFIX_BLOCK : (i + 1) * PREFIX_BLOCK]))
        out.append(h)
    return out


class Trace:
    """One request's times and model, for the metrics."""

    __slots__ = ("start", "first", "model")

    def __init__(self, start: float) -> None:
        self.start = start
        self.first = 0.0
        self.model = ""


class Gateway:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.keys: dict[str, Key] = {}
        self.stopped = False
        self._session: aiohttp.ClientSession | None = None
        self._table: dict[str, list[Endpoint]] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._version: tuple[int, int] = (-1, -1)
        self.requests = 0
        self.prefix_hits: dict[str, int] = {}
        self.metrics = Metrics()
        # Usage not yet written: (key id, model, replica) -> [requests, prompt, completion].
        self.pending: dict[tuple[str, str, str], list[int]] = {}
        # Tokens each key has used this month (the store's and what is pending).
        self.month: dict[str, int] = {}
        self.month_of = _month(time.time())

    # ------------------------------------------------------------------ state

    async def load(self) -> None:
        self.keys = {r.key_hash: Key(r) for r in await self.cp.store.list_api_keys()}
        self.stopped = (await self.cp.store.get_setting(STOPPED_SETTING)) == "true"
        await self._load_month(time.time())

    async def _load_month(self, now: float) -> None:
        self.month_of = _month(now)
        totals: dict[str, int] = {}
        for row in await self.cp.store.usage(self.month_of + "-01"):
            used = row["prompt_tokens"] + row["completion_tokens"]
            totals[row["key_id"]] = totals.get(row["key_id"], 0) + used
        for (key_id, _, _), (_, prompt, completion) in self.pending.items():
            totals[key_id] = totals.get(key_id, 0) + prompt + completion
        self.month = totals

    def record(self, key: Key, model: str, replica: str, prompt: int, completion: int) -> None:
        """Off the hot path: counted in memory, written by ``flush`` in batches."""
        entry = self.pending.get((key.record.id, model, replica))
        if entry is None:
            entry = self.pending[(key.record.id, model, replica)] = [0, 0, 0]
        entry[0] += 1
        entry[1] += prompt
        entry[2] += completion
        used = prompt + completion
        self.metrics.add_tokens(model, prompt, completion)
        key.tokens.add(time.time(), used)
        self.month[key.record.id] = self.month.get(key.record.id, 0) + used

    async def flush(self) -> None:
        pending, self.pending = self.pending, {}
        if not pending:
            return
        day = time.strftime("%Y-%m-%d", time.gmtime())
        rows = [(day, k, m, r, n, p, c) for (k, m, r), (n, p, c) in pending.items()]
        try:
            await self.cp.store.add_usage(rows)
        except Exception:
            for key, counts in pending.items():  # kept for the next flush
                entry = self.pending.setdefault(key, [0, 0, 0])
                for i in range(3):
                    entry[i] += counts[i]
            raise

    async def run(self, stop: asyncio.Event) -> None:
        """Write usage every two seconds; a new month starts every budget afresh."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=2.0)
            except TimeoutError:
                pass
            try:
                await self.flush()
                if _month(time.time()) != self.month_of:
                    await self._load_month(time.time())
            except Exception:
                log.exception("could not write usage; will retry")

    def key_changed(self, record: ApiKeyRecord) -> None:
        old = self.keys.get(record.key_hash)
        if old is None:
            self.keys[record.key_hash] = Key(record)
        else:
            old.record = record

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def table(self) -> dict[str, list[Endpoint]]:
        """Model name → its Ready replicas, rebuilt only when nodes or models changed."""
        version = (self.cp.registry.version, self.cp.models.version)
        if version == self._version:
            return self._table
        secret = self.cp.cluster_secret
        table: dict[str, list[Endpoint]] = {}
        seen: dict[str, Endpoint] = {}
        models = self.cp.models.models
        for view in self.cp.registry.nodes.values():
            if view.state != "Ready" or not view.address:
                continue
            for rid, shard in view.shards.items():
                if shard.get("state") != "ready" or not shard.get("port"):
                    continue
                parsed = parse_replica_id(rid)
                model = models.get(parsed[0]) if parsed else None
                profile = model.profile(parsed[1]) if model and parsed else None
                if model is None or profile is None:
                    continue
                host = view.address
                url = (
                    f"http://[{host}]:{shard['port']}/v1"
                    if ":" in host
                    else (f"http://{host}:{shard['port']}/v1")
                )
                endpoint = self._endpoints.get(rid)
                if endpoint is None or endpoint.url != url:
                    endpoint = Endpoint(rid, url, pki.engine_key(secret, rid), profile.priority)
                endpoint.priority = profile.priority
                seen[rid] = endpoint
                table.setdefault(model.name, []).append(endpoint)
        for model in models.values():
            if model.external:
                table[model.name] = self._external(model, seen, secret)
        for endpoints in table.values():
            endpoints.sort(key=lambda e: -e.priority)
        self._endpoints, self._table, self._version = seen, table, version
        return table

    def _external(self, model: Model, seen: dict[str, Endpoint], secret: bytes) -> list[Endpoint]:
        """One endpoint per key of an external provider: ``external:MODEL#N``."""
        spec = model.external or {}
        base = str(spec["base_url"]).rstrip("/")
        out = []
        for i, entry in enumerate(spec.get("keys") or [], start=1):
            name = f"external:{model.name}#{i}"
            endpoint = self._endpoints.get(name)
            if endpoint is None or endpoint.url != base:
                endpoint = Endpoint(
                    name,
                    base,
                    pki.unseal(secret, entry["sealed"]).decode(),
                    0,
                    external=True,
                )
            endpoint.weight = float(entry.get("weight") or 1.0)
            endpoint.upstream_model = spec.get("upstream_model") or None
            seen[name] = endpoint
            out.append(endpoint)
        return out

    def endpoints_of(self, model: str) -> list[Endpoint]:
        return list(self.table().get(model, ()))

    def pick(
        self, model: str, exclude: Endpoint | None = None, prefix: Sequence[int] = ()
    ) -> Endpoint | None:
        """The highest-priority pool with a usable replica; within it the replica that
        likely holds the longest shared prompt prefix in its cache, unless that one is
        much busier than the rest; else the least outstanding."""
        now = time.monotonic()
        pool: list[Endpoint] = []
        for endpoint in self.table().get(model, ()):
            if endpoint is exclude or endpoint.open_until > now:
                continue
            if pool and endpoint.priority < pool[0].priority:
                break  # a lower pool: the higher one had a replica
            pool.append(endpoint)
        if not pool:
            return None
        best = min(pool, key=lambda e: (e.outstanding + 1) / e.weight)
        if prefix:
            longest, affine = 0, None
            for endpoint in pool:
                held = endpoint.match(prefix)
                if held > longest:
                    longest, affine = held, endpoint
            if (
                affine is not None
                and longest >= PREFIX_MIN_BLOCKS
                and affine.outstanding <= best.outstanding + PREFIX_SLACK
            ):
                if affine is not best:
                    self.prefix_hits[model] = self.prefix_hits.get(model, 0) + 1
                best = affine
            best.remember(prefix)
        return best

    # --------------------------------------------------------------- requests

    def authorise(self, request: web.BaseRequest) -> Key | web.Response:
        header = request.headers.get("Authorization", "")
        if not header.startswith(("Bearer ", "bearer ")):
            return fail(
                401,
                "no API key: send 'Authorization: Bearer <key>' with a key from "
                "`llmgw ctl keys create`",
                "authentication_error",
                "invalid_api_key",
            )
        key = self.keys.get(key_hash(header[7:].strip()))
        if key is None or key.record.revoked_at is not None:
            return fail(401, "the API key is not valid", "authentication_error", "invalid_api_key")
        expires = key.record.expires_at
        if expires is not None and time.time() >= expires:
            return fail(401, "the API key has expired", "authentication_error", "expired_api_key")
        return key

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        trace = Trace(time.perf_counter())
        response = await self._handle(request, trace)
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
        for model, endpoints in self.table().items():
            for e in endpoints:
                inflight[(model, e.replica_id)] = e.outstanding
                if not e.external:
                    targets.append((model, e.replica_id, e.url[:-3] + "/metrics", e.key))
        engines = await scrape(self.session, targets)
        return self.metrics.render(inflight, self.prefix_hits, engines)

    async def _handle(self, request: web.BaseRequest, trace: Trace) -> web.StreamResponse:
        self.requests += 1
        key = self.authorise(request)
        if isinstance(key, web.Response):
            return key
        path = request.path
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
        if request.content_length is not None and request.content_length > MAX_BODY:
            return fail(
                400,
                f"the request body is over {MAX_BODY // 2**20} MiB; send less",
                "invalid_request_error",
                "body_too_large",
            )
        raw = await request.read()
        if len(raw) > MAX_BODY:
            return fail(
                400,
                f"the request body is over {MAX_BODY // 2**20} MiB; send less",
                "invalid_request_error",
                "body_too_large",
            )
        try:
            body = json.loads(raw)
        except ValueError:
            return fail(
                400, "the request body is not JSON", "invalid_request_error", "invalid_json"
            )
        if not isinstance(body, dict):
            return fail(
                400,
                "the request body must be a JSON object",
                "invalid_request_error",
                "invalid_json",
            )
        name = body.get("model")
        if not isinstance(name, str) or not name:
            return fail(
                400,
                "the request names no model ('model' is required)",
                "invalid_request_error",
                "missing_model",
                "model",
            )
        model = self.cp.models.models.get(name)
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
                f"the model '{name}' is stopped (`llmgw ctl model start {name}`)",
                "service_unavailable",
                "model_stopped",
            )
        limited = self.check_limits(key)
        if limited is not None:
            return limited
        if model.max_output:
            for field_name in ("max_tokens", "max_completion_tokens"):
                asked = body.get(field_name)
                if isinstance(asked, int) and asked > model.max_output:
                    body[field_name] = model.max_output
                    raw = b""
            if (
                kind != "embedding"
                and "max_tokens" not in body
                and ("max_completion_tokens" not in body)
            ):
                body["max_tokens"] = model.max_output
                raw = b""
        if not raw:
            raw = json.dumps(body).encode()
        prefix = prompt_prefix(body) if kind != "embedding" else []
        endpoint = self.pick(name, prefix=prefix)
        if endpoint is None and model.on_demand and body.get("stream"):
            return await self.stream_when_ready(request, path, raw, name, key, trace)
        if endpoint is None:
            endpoint = await self.wait_for_replica(model.name, model.on_demand)
            if endpoint is None:
                return fail(
                    503,
                    f"the model '{name}' has no Ready replica now; `llmgw ctl models` says why",
                    "service_unavailable",
                    "no_replica",
                )
        elif model.on_demand:
            self.cp.models.reconciler.want(model.name)
        key.requests.add(time.time(), 1)
        return await self.proxy(
            request, path, raw, bool(body.get("stream")), name, endpoint, key, trace
        )

    def check_limits(self, key: Key) -> web.Response | None:
        record = key.record
        now = time.time()
        if record.rpm is not None and key.requests.count(now) >= record.rpm:
            return self.limited(
                "requests per minute", record.rpm, key.requests.retry_after(now, record.rpm)
            )
        if record.tpm is not None and key.tokens.count(now) >= record.tpm:
            return self.limited(
                "tokens per minute", record.tpm, key.tokens.retry_after(now, record.tpm)
            )
        if record.budget is not None and self.month.get(record.id, 0) >= record.budget:
            return self.limited(
                "tokens a month (its budget)", record.budget, _seconds_to_next_month(now)
            )
        return None

    @staticmethod
    def limited(what: str, limit: int, retry: int) -> web.Response:
        answer = fail(
            429,
            f"over this key's limit of {limit} {what}; try again in {retry} s",
            "rate_limit_error",
            "rate_limit_exceeded",
        )
        answer.headers["Retry-After"] = str(retry)
        return answer

    async def wait_for_replica(self, model: str, on_demand: bool) -> Endpoint | None:
        if not on_demand:
            return None
        self.cp.models.reconciler.want(model)
        self.cp.models.wake()
        deadline = time.monotonic() + self.cp.config.gateway.on_demand_wait
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            endpoint = self.pick(model)
            if endpoint is not None:
                return endpoint
        return None

    def list_models(self, key: Key) -> web.Response:
        data = [
            {"id": m.name, "object": "model", "created": 0, "owned_by": "llmgw"}
            for name, m in sorted(self.cp.models.models.items())
            if key.may_use(name)
        ]
        return web.Response(
            body=json.dumps({"object": "list", "data": data}).encode(), content_type=_JSON
        )

    async def proxy(
        self,
        request: web.BaseRequest,
        path: str,
        raw: bytes,
        stream: bool,
        model: str,
        endpoint: Endpoint,
        key: Key,
        trace: Trace,
    ) -> web.StreamResponse:
        last: _Retryable | None = None
        # One retry after a replica's failure; a provider's refused key is passed over
        # without using it up (its breaker keeps it out of the next pick).
        retries = 1
        for _attempt in range(16):
            current = endpoint
            current.outstanding += 1
            try:
                response, prompt, completion = await self._forward(
                    request, path, raw, stream, current, trace
                )
                self.record(key, model, current.replica_id, prompt, completion)
                return response
            except _Retryable as exc:
                if current.external and current.open_until > time.monotonic():
                    pass  # a refused key: the next key, as many as there are
                else:
                    self._failed(current)
                    retries -= 1
                log.info("%s failed before answering: %s", current.replica_id, exc)
                last = exc
            finally:
                current.outstanding -= 1
            nxt = self.pick(model, exclude=current)
            if nxt is None or retries < 0:
                break
            endpoint = nxt
        assert last is not None
        return last.answer

    def _key_refused(self, endpoint: Endpoint, status: int, retry_after: str | None) -> None:
        """A provider's key answered 429 (pass it over a while) or 401/403 (pass it
        over until its key changes); said by endpoint name, never by key."""
        now = time.monotonic()
        if status == 429:
            try:
                wait = min(300.0, max(1.0, float(retry_after or 30)))
            except ValueError:
                wait = 30.0
            endpoint.open_until = now + wait
            endpoint.problem = f"answered 429 (rate limited): passed over for {wait:g} s"
        else:
            endpoint.open_until = now + 3600
            endpoint.problem = f"answered {status}: the provider refused this key"
        log.warning("%s %s", endpoint.replica_id, endpoint.problem)

    def _failed(self, endpoint: Endpoint) -> None:
        endpoint.failures += 1
        if endpoint.failures >= BREAKER_FAILURES:
            endpoint.open_until = time.monotonic() + BREAKER_OPEN
            endpoint.failures = 0
            endpoint.problem = ""

    async def _forward(
        self,
        request: web.BaseRequest,
        path: str,
        raw: bytes,
        stream: bool,
        endpoint: Endpoint,
        trace: Trace,
        prepared: web.StreamResponse | None = None,
    ) -> tuple[web.StreamResponse, int, int]:
        """The answer and its (prompt, completion) tokens: the engine's usage where it
        gave one, else a stream's content events counted."""
        headers = {"Authorization": f"Bearer {endpoint.key}", "Content-Type": _JSON}
        if endpoint.upstream_model:
            body = json.loads(raw)
            body["model"] = endpoint.upstream_model
            raw = json.dumps(body).encode()
        try:
            # Every base ends in the provider's /v1 (or its equivalent): path less "/v1".
            upstream = await self.session.post(endpoint.url + path[3:], data=raw, headers=headers)
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise _Retryable(
                fail(
                    502,
                    f"the replica could not be reached: {exc}",
                    "api_error",
                    "upstream_unreachable",
                ),
                str(exc),
            ) from None
        async with upstream:
            refused_key = endpoint.external and upstream.status in (401, 403, 429)
            if refused_key or upstream.status >= 500:
                # Not the client's answer yet: another replica or key may give a better one.
                if refused_key:
                    retry_after = upstream.headers.get("Retry-After")
                    self._key_refused(endpoint, upstream.status, retry_after)
                answer = web.Response(
                    status=upstream.status,
                    body=await upstream.read(),
                    content_type=upstream.content_type or _JSON,
                )
                raise _Retryable(answer, f"HTTP {upstream.status}")
            endpoint.failures = 0
            if prepared is not None and upstream.status != 200:
                raise _Retryable(fail(502, "", "api_error"), f"HTTP {upstream.status}")
            if not stream or upstream.status != 200:
                data = await upstream.read()
                prompt, completion = _usage(data) if upstream.status == 200 else (0, 0)
                answer = web.Response(
                    status=upstream.status,
                    body=data,
                    content_type=upstream.content_type or _JSON,
                )
                return answer, prompt, completion
            response = prepared
            if response is None:
                response = web.StreamResponse(status=200)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP:
                        response.headers[name] = value
                await response.prepare(request)
            # Once a byte is sent there is no failing over: the stream ends as it ends.
            events = 0
            tail = b""
            async for chunk in upstream.content.iter_any():
                if not trace.first:
                    trace.first = time.perf_counter()
                await response.write(chunk)
                events += chunk.count(b"data: ")
                tail = (tail + chunk)[-8192:]
            await response.write_eof()
            prompt, completion = _stream_usage(tail)
            if not completion:
                completion = max(0, events - 1)  # every event but [DONE], about a token each
            return response, prompt, completion

    async def stream_when_ready(
        self,
        request: web.BaseRequest,
        path: str,
        raw: bytes,
        model: str,
        key: Key,
        trace: Trace,
    ) -> web.StreamResponse:
        """A stream asked of an on-demand model at zero: the stream begins at once and a
        comment line every KEEPALIVE seconds keeps the connection (and its proxies)
        alive while a replica starts; then the replica's stream follows."""
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        self.cp.models.reconciler.want(model)
        self.cp.models.wake()
        deadline = time.monotonic() + self.cp.config.gateway.on_demand_wait
        said = 0.0
        endpoint = self.pick(model)
        while endpoint is None:
            now = time.monotonic()
            if now > deadline:
                await _stream_error(
                    response, f"no replica of '{model}' started in time", "no_replica"
                )
                return response
            if now - said >= KEEPALIVE:
                await response.write(f": llmgw: starting a replica of {model}\n\n".encode())
                said = now
            await asyncio.sleep(0.25)
            endpoint = self.pick(model)
        key.requests.add(time.time(), 1)
        endpoint.outstanding += 1
        try:
            _, prompt, completion = await self._forward(
                request, path, raw, True, endpoint, trace, prepared=response
            )
        except _Retryable as exc:
            await _stream_error(response, f"the replica failed: {exc}", "upstream_error")
            return response
        finally:
            endpoint.outstanding -= 1
        self.record(key, model, endpoint.replica_id, prompt, completion)
        return response


async def _stream_error(response: web.StreamResponse, message: str, code: str) -> None:
    """An error once a stream has begun: an event in OpenAI's error shape, then the end."""
    error = {"error": {"message": message, "type": "api_error", "param": None, "code": code}}
    await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
    await response.write_eof()


def _usage(data: bytes) -> tuple[int, int]:
    if b'"usage"' not in data:
        return 0, 0
    try:
        usage = json.loads(data).get("usage") or {}
    except (ValueError, AttributeError):
        return 0, 0
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    if not completion and usage.get("total_tokens"):
        completion = max(0, int(usage["total_tokens"]) - prompt)
    return prompt, completion


def _stream_usage(tail: bytes) -> tuple[int, int]:
    """The usage of a stream's last event that has one (``include_usage``)."""
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            return _usage(line[6:])
    return 0, 0


def _month(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def _seconds_to_next_month(now: float) -> int:
    t = time.gmtime(now)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    start = calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0))
    return max(1, int(start - now))


class _Retryable(Exception):
    """A replica failed before the client got a byte; ``answer`` if none other can."""

    def __init__(self, answer: web.Response, why: str) -> None:
        super().__init__(why)
        self.answer = answer
