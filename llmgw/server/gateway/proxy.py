"""A checked request on its way to a replica, and the answer on its way back.

How an engine's answer is judged:

- 2xx: the client's answer; the replica succeeded.
- 4xx, 501 (the replica does not do that: embeddings of a chat model), or a 5xx whose
  body says the engine could not read the request (llama.cpp answers 500 to JSON it
  cannot parse): about the request, so the client's answer in OpenAI's error shape
  (a 5xx of that kind becomes a 400), never held against the replica.
- Any other 5xx, a refused or reset connection, a connect timeout: a failure of the
  replica, counted by the router's breaker, and retried once on another replica when
  no byte has reached the client.
- A pooled connection the engine had already closed (it fails before any byte came
  back): retried once on the same replica over a new connection, not counted.

llama.cpp's server closes its connection after every stream while announcing
keep-alive; its streams are sent with ``Connection: close``, which it echoes, so such a
connection never goes back to the pool.

Requests go to engines and providers over the gateway's own HTTP/1.1 client
(``engineclient.py``); aiohttp's client remains for what is not a client's request: the
probe of silent agents' engines and the scrape of engines' metrics.

Streams pass through event by event. The engine is always asked for the stream's usage
(``stream_options.include_usage``), so streamed tokens are counted like any others;
a client that did not ask for it never sees it. A request past ``request_timeout`` is
a 504 (or, once a stream began, an error event); a client that goes away cancels the
engine's request, since its connection to the engine is closed with it. An engine that
fails mid-stream (reading from it fails; a failed write is the client leaving) is a
failure of its replica, and its chat answer goes on from another replica in the same
stream; any other ends with an error event (``resume.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from llmgw import jsonvalue
from llmgw.server.gateway.adapters import Asked
from llmgw.server.gateway.engineclient import (
    CONNECT_TIMEOUT,
    POOL_KEEPALIVE,
    BadAnswer,
    EngineConnection,
    EnginePool,
    Lost,
)
from llmgw.server.gateway.errors import JSON, bad_request, fail, stream_error
from llmgw.server.gateway.resume import Broke, Counts, Resume
from llmgw.server.gateway.router import Endpoint, Router

log = logging.getLogger("llmgw.gateway")
# A request a guard policy flagged (the gateway sets it): its answer's head says so.
GUARD_HEADER = "x-llmgw-guard"
GUARD_FLAG = web.RequestKey("llmgw_guard_flag", str)

# An incomplete event longer than this is passed on as it is (it is not SSE).
MAX_HELD = 1 << 20
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
# What an engine says when it could not read the request, in a 5xx: llama.cpp's JSON
# library ("[json.exception.parse_error.101] ... invalid literal"), and plainer words.
_ABOUT_THE_REQUEST = re.compile(
    rb"json\.exception|parse error|invalid literal|failed to parse|could not parse|"
    rb"cannot parse|unable to parse|JSONDecodeError|is not valid JSON",
    re.IGNORECASE,
)


class Trace:
    """One request's times and model, for the metrics; where it went and what it used,
    for its span (``spans.py``) when tracing is on."""

    __slots__ = (
        "start",
        "first",
        "model",
        "replica",
        "node",
        "engine",
        "retries",
        "resumes",
        "prompt",
        "completion",
    )

    def __init__(self, start: float) -> None:
        self.start = start
        self.first = 0.0
        self.model = ""
        self.replica = ""
        self.node = ""
        self.engine = ""
        # Other replicas (or keys) tried after one failed, and streams carried on.
        self.retries = 0
        self.resumes = 0
        # Tokens as counted for the key; None: no answer was counted.
        self.prompt: int | None = None
        self.completion: int | None = None

    def used(self, prompt: int, completion: int) -> None:
        self.prompt = (self.prompt or 0) + prompt
        self.completion = (self.completion or 0) + completion


class Tally:
    """What an answer used: its tokens as the engine said, else a stream's events."""

    __slots__ = ("prompt", "completion", "answered", "response", "resume")

    def __init__(self, resume: Resume | None = None) -> None:
        self.prompt = 0
        self.completion = 0
        self.answered = False
        # The client's stream, once it began: after that there is no failing over,
        # only its continuation on another replica (resume.py).
        self.response: web.StreamResponse | None = None
        self.resume = resume


class ReplicaFailed(Exception):
    """The replica itself failed before the client got a byte; ``answer`` if no other can."""

    def __init__(self, answer: web.Response, why: str) -> None:
        super().__init__(why)
        self.answer = answer


class KeyRefused(ReplicaFailed):
    """An external provider refused this key (429, 401, 403): the next key may not."""


class Stale(Exception):
    """The pooled connection was closed by the engine before any byte came back."""


def read_usage(usage: object) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    prompt, completion, total = (
        usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    )
    prompt = prompt if isinstance(prompt, int) and prompt >= 0 else 0
    completion = completion if isinstance(completion, int) and completion >= 0 else 0
    if not completion and isinstance(total, int) and total > prompt:
        completion = total - prompt
    return prompt, completion


def answer_usage(data: bytes) -> tuple[int, int]:
    """The tokens of a whole (not streamed) answer."""
    if b'"usage"' not in data:
        return 0, 0
    try:
        body = json.loads(data)
    except ValueError:
        return 0, 0
    return read_usage(body.get("usage") if isinstance(body, dict) else None)


class StreamTap:
    """Passes a stream on in whole events: counts them, reads the usage event, and keeps
    the usage from a client that did not ask for it."""

    __slots__ = ("strip", "held", "events", "prompt", "completion")

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.held = b""
        self.events = 0
        self.prompt = 0
        self.completion = 0

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk if self.held else chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            if len(data) > MAX_HELD:
                self.held = b""
                return data
            self.held = data
            return b""
        cut += 2
        done, self.held = data[:cut], data[cut:]
        self.events += done.count(b"data:")
        if b'"usage"' in done:
            done = self._usage(done)
        return done

    def end(self) -> bytes:
        rest, self.held = self.held, b""
        return rest

    def _usage(self, done: bytes) -> bytes:
        """Read (and, not asked for, take out) the usage: only the events that mention
        it are parsed, the rest passed on as they are."""
        out = []
        at = 0
        while (hit := done.find(b'"usage"', at)) >= 0:
            start = done.rfind(b"\n\n", at, hit)
            start = at if start < 0 else start + 2
            end = done.find(b"\n\n", hit) + 2  # done ends with an event's end
            out.append(done[at:start])
            at = end
            event = done[start:end]
            if not event.startswith(b"data:"):
                out.append(event)
                continue
            try:
                body = json.loads(event[5:])
            except ValueError:
                body = None
            if isinstance(body, dict) and isinstance(body.get("usage"), dict):
                self.prompt, self.completion = read_usage(body["usage"])
                if self.strip:
                    if not body.get("choices"):
                        continue  # the usage's own event: not asked for, not sent
                    del body["usage"]
                    event = b"data: " + json.dumps(body).encode() + b"\n\n"
            out.append(event)
        out.append(done[at:])
        return b"".join(out)

    def tokens(self) -> tuple[int, int]:
        if self.completion or self.prompt:
            return self.prompt, self.completion
        return 0, max(0, self.events - 1)  # every event but [DONE], about a token each


class Upstream:
    """The connections to engines and providers, and one request's way through them."""

    def __init__(
        self,
        router: Router,
        request_timeout: float,
        released: Callable[[str], None] = lambda model: None,
    ) -> None:
        self.router = router
        self.request_timeout = request_timeout
        # A request of the model left its replica: the gateway's queue wakes the next.
        self.released = released
        self.pool = EnginePool()
        self._session: aiohttp.ClientSession | None = None
        self.stale_retries = 0
        # Streams continued on another replica, and those that could not be (resume.py).
        self.resumes = Counts()

    @property
    def session(self) -> aiohttp.ClientSession:
        """aiohttp's client, for what is not a client's request: probes, metrics."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=POOL_KEEPALIVE),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def close(self) -> None:
        self.pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self,
        request: web.BaseRequest,
        path: str,
        raw: bytes,
        model: str,
        endpoint: Endpoint,
        trace: Trace,
        stream: bool,
        strip_usage: bool,
        record: Callable[[str, int, int], None],
        prepared: web.StreamResponse | None = None,
        adapter: Asked | None = None,
    ) -> web.StreamResponse:
        """The answer of ``endpoint``, or of the next replica when it fails first;
        for a LoRA ``adapter``, the body each replica's engine reads it in."""
        router = self.router
        last: ReplicaFailed | None = None
        retries = 1  # one retry after a replica's failure
        stale_retried = False
        fresh = False
        tally = Tally()
        resume = None
        if stream:
            # Kept as sent, to go on from another replica if its engine fails; its usage
            # is then recorded once, by the part that ends it.
            resume = Resume(model, path, raw, strip_usage, record, self.resumes)
            record = resume.record
        try:
            async with asyncio.timeout(self.request_timeout):
                for _attempt in range(16):
                    current = endpoint
                    trace.replica, trace.node = current.replica_id, current.node
                    trace.engine = current.engine
                    tally = Tally(resume)
                    current.outstanding += 1
                    router.serves(current)
                    body = raw if resume is None else resume.body
                    try:
                        answer = await self._forward(
                            request,
                            path,
                            adapter.body_for(current, body) if adapter else body,
                            current,
                            trace,
                            tally,
                            stream,
                            strip_usage,
                            fresh,
                            # A continuation goes on in the client's stream.
                            prepared or (resume.response if resume else None),
                        )
                        return answer if resume is None else await resume.answered(answer)
                    except Broke as exc:
                        # Mid-stream: no failing over, but the answer may go on elsewhere.
                        if not current.external:
                            router.failed(model, current, str(exc))
                        tally.answered = False  # counted with the part that ends it
                        assert resume is not None and resume.response is not None
                        nxt = await resume.broke(current, router, self.session)
                        if nxt is None:
                            return resume.response
                        endpoint, fresh = nxt, False
                        trace.resumes += 1
                        continue
                    except Stale as exc:
                        if not stale_retried:
                            stale_retried, fresh = True, True
                            self.stale_retries += 1
                            log.debug("%s: stale connection (%s)", current.replica_id, exc)
                            continue
                        last = ReplicaFailed(_unreachable(str(exc)), str(exc))
                        router.failed(model, current, str(exc))
                        retries -= 1
                    except KeyRefused as exc:
                        last = exc  # the next key, as many as there are
                    except ReplicaFailed as exc:
                        last = exc
                        router.failed(model, current, str(exc))
                        retries -= 1
                    finally:
                        current.outstanding -= 1
                        router.serves(current)
                        self.released(model)
                        if tally.answered:
                            record(current.replica_id, tally.prompt, tally.completion)
                    fresh = False
                    nxt = router.pick(model, exclude=current)
                    if nxt is None or retries < 0:
                        break
                    endpoint = nxt
                    trace.retries += 1
        except TimeoutError:
            message = (
                f"no whole answer within {self.request_timeout:g} s "
                "(gateway.request_timeout in server.yaml)"
            )
            started = tally.response or prepared or (resume.response if resume else None)
            if started is not None and started.prepared:
                try:
                    await stream_error(started, message, "request_timeout")
                except (ConnectionError, RuntimeError):
                    pass  # the client is gone, or the stream had ended
                if resume is not None:
                    resume.settle()
                return started
            return fail(504, message, "timeout_error", "request_timeout")
        assert last is not None
        if resume is not None and resume.parts and resume.response is not None:
            # No replica took up the answer's continuation: its stream ends with why.
            await resume.fail("failed", str(last))
            return resume.response
        return last.answer

    async def _forward(
        self,
        request: web.BaseRequest,
        path: str,
        raw: bytes,
        endpoint: Endpoint,
        trace: Trace,
        tally: Tally,
        stream: bool,
        strip_usage: bool,
        fresh: bool,
        prepared: web.StreamResponse | None,
    ) -> web.StreamResponse:
        if endpoint.upstream_model:
            body = json.loads(raw)
            body["model"] = endpoint.upstream_model
            raw = json.dumps(body).encode()
        pool = self.pool
        try:
            origin = pool.origin(endpoint.url)
            # The engine closes this connection after a stream anyway; said up front, its
            # answer says so too, and the connection never goes back to the pool.
            close = stream and endpoint.closes_after_stream
            # Every base ends in the provider's /v1 (or its equivalent): path less "/v1".
            message = origin.request(path[3:], endpoint.key, raw, close)
        except ValueError as exc:
            raise ReplicaFailed(_unreachable(str(exc)), str(exc)) from None
        conn = None if fresh else pool.take(origin)
        if conn is None:
            try:
                conn = await pool.connect(origin)
            except (OSError, TimeoutError) as exc:
                why = f"cannot connect to {origin.authority}: {exc or type(exc).__name__}"
                raise ReplicaFailed(_unreachable(why), why) from None
        try:
            conn.send(message, close)
            try:
                await conn.head()
            except Lost as exc:
                if exc.early:
                    raise Stale(str(exc)) from None
                raise ReplicaFailed(_unreachable(str(exc)), str(exc)) from None
            except BadAnswer as exc:
                why = f"an answer the gateway cannot read: {exc}"
                raise ReplicaFailed(_unreachable(why), why) from None
            status = conn.status
            if endpoint.external and status in (401, 403, 429):
                self.router.key_refused(endpoint, status, conn.header("retry-after"))
                body = await _read(conn)
                raise KeyRefused(_passed_on(conn, body), f"HTTP {status}")
            if status >= 500 and status != 501:
                body = await _read(conn)
                if _ABOUT_THE_REQUEST.search(body[:4096]):
                    # The engine could not read what the client sent: the client's to fix.
                    tally.answered = True
                    return bad_request(
                        f"the engine could not read the request: {_message(body)}",
                        "invalid_request",
                    )
                raise ReplicaFailed(_passed_on(conn, body), f"HTTP {status}")
            if status >= 400:
                # About the request, in the client's error shape: a 4xx, or 501 (the
                # replica does not do what was asked, embeddings of a chat model say).
                body = await _read(conn)
                tally.answered = True
                return _refused_by_engine(400 if status == 501 else status, body)
            self.router.succeeded(endpoint)
            if not stream:
                try:
                    data = await conn.read()
                except (OSError, BadAnswer) as exc:
                    raise ReplicaFailed(_unreachable(str(exc)), f"while answering: {exc}") from None
                tally.prompt, tally.completion = answer_usage(data)
                tally.answered = True
                trace.first = trace.first or time.perf_counter()
                return _passed_on(conn, data)
            return await self._relay(request, conn, endpoint, trace, tally, strip_usage, prepared)
        finally:
            # Back to the pool only when its answer was read to the end, still open and
            # kept alive; anything else (a timeout, a client gone) closes it, so the
            # engine hears the request go.
            if conn.complete:
                pool.give_back(origin, conn)
            else:
                conn.close()

    async def _relay(
        self,
        request: web.BaseRequest,
        conn: EngineConnection,
        endpoint: Endpoint,
        trace: Trace,
        tally: Tally,
        strip_usage: bool,
        prepared: web.StreamResponse | None,
    ) -> web.StreamResponse:
        """A stream, event by event; once a byte is sent there is no failing over, and an
        engine that fails mid-stream is ``Broke`` (its answer may go on elsewhere)."""
        response = prepared
        if response is None:
            response = _Stream(status=200)
            for name, value in conn.headers:
                if name.lower() not in _HOP:
                    response.headers[name] = value
            flagged = request.get(GUARD_FLAG)  # a guard policy flagged the prompt
            if flagged is not None:
                response.headers[GUARD_HEADER] = flagged
            await response.prepare(request)
        tally.response = response
        resume = tally.resume
        if resume is not None:
            resume.response = response
        tap = StreamTap(strip_usage)
        tally.answered = True
        try:
            while True:
                try:
                    chunk = await conn.chunk()
                except (OSError, BadAnswer) as exc:
                    # The engine's side failed: the answer may go on elsewhere (resume.py).
                    raise Broke(f"its stream broke: {exc}") from None
                if not chunk:
                    out = tap.end()
                    break
                if not trace.first:
                    trace.first = time.perf_counter()
                out = tap.feed(chunk)
                if conn.complete:
                    # The stream's last bytes: sent with its end, in one write.
                    out += tap.end()
                    break
                if out:
                    await response.write(out if resume is None else resume.passing(out))
            await response.write_eof(out if resume is None else resume.passing(out))
        except OSError as exc:
            # Writing failed: the client went away mid-stream. It ends as it ends.
            log.info("%s: stream ended early: %s", endpoint.replica_id, exc)
        finally:
            tally.prompt, tally.completion = tap.tokens()
        return response


class _Stream(web.StreamResponse):
    """A relayed stream whose head goes out with its first event, in one write instead
    of two (aiohttp's switch, the one its ``web.Response`` uses)."""

    _send_headers_immediately = False


async def _read(conn: EngineConnection) -> bytes:
    try:
        return await conn.read()
    except (OSError, BadAnswer):
        return b""


def _passed_on(conn: EngineConnection, body: bytes) -> web.Response:
    return web.Response(status=conn.status, body=body, content_type=conn.content_type or JSON)


def _refused_by_engine(status: int, body: bytes) -> web.Response:
    """An engine's refusal in OpenAI's error shape whatever the engine wrote (llama.cpp
    gives ``code`` as a number): its message, type and param kept."""
    try:
        parsed: jsonvalue.JSON = json.loads(body)
    except ValueError:
        parsed = None
    found = parsed.get("error") if isinstance(parsed, dict) else None
    error = found if isinstance(found, dict) else {}
    kind = error.get("type")
    param = error.get("param")
    code = error.get("code")
    return fail(
        status,
        _message(body),
        kind if isinstance(kind, str) and kind else "invalid_request_error",
        str(code) if code is not None else None,
        param if isinstance(param, str) else None,
    )


def _message(body: bytes) -> str:
    """The engine's own words from its error answer, short."""
    try:
        parsed = json.loads(body)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str):
            return message[:500]
    except ValueError:
        pass
    return body[:500].decode("utf-8", "replace")


def _unreachable(why: str) -> web.Response:
    return fail(
        502, f"the replica could not be reached: {why}", "api_error", "upstream_unreachable"
    )
