"""A stream that survives its replica: a streamed chat answer whose engine fails
mid-stream goes on from another replica, in the same client stream.

When the engine's side of a stream fails before its end (its connection reset or
closed, an answer that is not HTTP; a failed write to the client is the client going
away, never this), the failure counts against the replica (``Router.failed``) and the
answer is continued when:

- the request is a chat completion (``/v1/chat/completions``) with ``n`` absent or 1,
  no constraint on its output (a JSON ``response_format``, a grammar, guided
  decoding: the constraint would start again in the middle) and no ``echo``;
- what was sent so far holds no tool-call and no reasoning deltas;
- it was served by a replica, not an external provider's key;
- it was continued fewer than MAX_RESUMES times already;
- another replica of the model is usable (``Router.pick``).

The next replica is sent the same request with what the client already got as a final
assistant message to continue: llama.cpp continues a trailing assistant message by
default (its server's ``prefill_assistant`` renders the rest with the generation
prompt and appends it), vLLM and SGLang are told ``continue_final_message`` without
a generation prompt. Its answer's length (``max_tokens``, ``max_completion_tokens``,
``n_predict``) is what is left: each content event sent is about one token; with
nothing left the stream just ends, its finish reason ``length``. The continuation's
events pass into the client's stream as the first engine's would have: its leading
role-only chunk dropped, ``id`` and ``created`` the first stream's, its usage kept
from a client that did not ask (``StreamTap``) and, to one that did, the whole
answer's.

The usage is counted once, under the replica that ended the stream. Completion tokens:
the content events sent before the failure, plus the continuation's. Prompt tokens: the
request's own, counted at the first failure by the continuing replica's tokenizer as
its engine counts a request's (``kvroute.prompt_tokens``: llama.cpp's
``/apply-template`` then ``/tokenize`` with its BOS, vLLM's ``/tokenize`` of the
messages), or by another usable replica's when the gateway ends the stream itself (its
answer was whole, or its length used up). Only when no tokenizer answers is it the
continuation's prompt less the tokens of what it continued (to about a token: the
prefix tokenized alone may differ at the seam), and 0 when nothing was continued. A
stream cut short and not continued counts its content events and no prompt tokens
(an engine says those only at the stream's end), as any stream cut short always did.

Any other failure mid-stream ends the stream with an error event in OpenAI's shape
(``errors.stream_error``), counted by reason. The healthy path pays a list append a
write: the bytes sent are kept as sent and read only when a continuation is needed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from llmgw import jsonvalue
from llmgw.jsonvalue import JSONObject
from llmgw.server.gateway import kvroute
from llmgw.server.gateway.checks import LENGTH_FIELDS
from llmgw.server.gateway.errors import JSON, stream_error
from llmgw.server.gateway.router import Endpoint, Router

log = logging.getLogger("llmgw.gateway")

CHAT_PATH = "/v1/chat/completions"
# Continuations of one request at most: a stream whose replicas keep failing ends.
MAX_RESUMES = 2
# A stream is kept for its continuation up to this many bytes; past it, not continued.
KEEP_MAX = 16 << 20
# Engines told to continue the final assistant message; llama.cpp does unasked.
TOLD_TO_CONTINUE = frozenset({"vllm", "sglang"})
# Fields that constrain the output: a continuation would start the constraint over.
CONSTRAINTS = (
    "grammar",
    "json_schema",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
# Why a stream was not continued (llmgw_gateway_stream_resume_failures_total{reason}).
REASONS = {
    "not_chat": "only chat completions are continued",
    "external": "an external provider's stream is not continued",
    "choices": "a request for several choices is not continued",
    "constrained": "an answer held to a format or grammar is not continued",
    "echo": "an answer that echoes its prompt is not continued",
    "tool_calls": "an answer that began calling tools is not continued",
    "reasoning": "an answer that began reasoning is not continued",
    "too_long": f"an answer past {KEEP_MAX >> 20} MiB is not continued",
    "limit": f"it was continued {MAX_RESUMES} times already",
    "no_replica": "no other replica of the model is usable",
    "refused": "the next replica refused the continuation",
    "failed": "the next replicas failed before answering",
}

Record = Callable[[str, int, int], None]


class Broke(Exception):
    """The engine's side of a stream failed before the stream's end."""


@dataclass
class Counts:
    """Streams continued on another replica, by model; and those that could not be,
    by (model, reason)."""

    resumed: dict[str, int] = field(default_factory=dict)
    failed: dict[tuple[str, str], int] = field(default_factory=dict)

    def resume(self, model: str) -> None:
        self.resumed[model] = self.resumed.get(model, 0) + 1

    def fail(self, model: str, reason: str) -> None:
        key = (model, reason)
        self.failed[key] = self.failed.get(key, 0) + 1


@dataclass
class Sent:
    """What a client's stream was sent, read back from its bytes."""

    id: str | None = None
    created: int | None = None
    model: str | None = None
    text: str = ""
    # Content events: about a token each.
    tokens: int = 0
    role: bool = False
    tool_calls: bool = False
    reasoning: bool = False
    # A finish reason, the usage, the stream's [DONE]: its end had begun.
    finished: bool = False
    usage: bool = False
    done: bool = False


def read_sent(data: bytes) -> Sent:
    """The events in ``data`` (whole SSE events, as the tap passes them on)."""
    sent = Sent()
    parts: list[str] = []
    for event in data.split(b"\n\n"):
        if not event.startswith(b"data:"):
            continue
        payload = event[5:].strip()
        if payload == b"[DONE]":
            sent.done = True
            continue
        try:
            body = json.loads(payload)
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        if sent.id is None and isinstance(body.get("id"), str):
            sent.id = body["id"]
            created = body.get("created")
            sent.created = created if isinstance(created, int) else None
            model = body.get("model")
            sent.model = model if isinstance(model, str) else None
        if body.get("usage"):
            sent.usage = True
        choices = body.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                sent.finished = True
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            sent.role = sent.role or bool(delta.get("role"))
            content = delta.get("content")
            if isinstance(content, str) and content:
                parts.append(content)
                sent.tokens += 1
            if delta.get("tool_calls") or delta.get("function_call"):
                sent.tool_calls = True
            if delta.get("reasoning_content") or delta.get("reasoning"):
                sent.reasoning = True
    sent.text = "".join(parts)
    return sent


def not_resumable(body: JSONObject, sent: Sent, endpoint: Endpoint) -> str | None:
    """Why this request's stream cannot be continued (a key of REASONS), or None."""
    if endpoint.external:
        return "external"
    if body.get("n") not in (None, 1):
        return "choices"
    form = body.get("response_format")
    if isinstance(form, dict) and form.get("type") in ("json_object", "json_schema"):
        return "constrained"
    if any(body.get(name) is not None for name in CONSTRAINTS):
        return "constrained"
    if body.get("echo"):
        return "echo"
    if sent.tool_calls:
        return "tool_calls"
    if sent.reasoning:
        return "reasoning"
    return None


def _lengths(body: JSONObject) -> dict[str, int]:
    """The answer's lengths the request sets (llama.cpp's ``n_predict`` -1: none)."""
    out: dict[str, int] = {}
    for name in LENGTH_FIELDS:
        asked = body.get(name)
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
            out[name] = asked
    return out


def used_up(body: JSONObject, tokens: int) -> bool:
    """``tokens`` sent are all the answer may have."""
    return any(asked <= tokens for asked in _lengths(body).values())


def continuation(body: JSONObject, text: str, tokens: int, engine: str) -> JSONObject | None:
    """The request that continues an answer of which ``text`` (about ``tokens``
    tokens) was sent, for ``engine``; None when its length is used up."""
    if used_up(body, tokens):
        return None
    out = dict(body)
    for name, asked in _lengths(body).items():
        out[name] = asked - tokens
    if not text:
        return out  # nothing of the answer was sent: the same request again
    found = out.get("messages")
    messages = list(found) if isinstance(found, list) else []
    last = messages[-1] if messages else None
    begun = last.get("content") if isinstance(last, dict) else None
    if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(begun, str):
        # The client had begun the answer itself: the engine was continuing it already.
        messages[-1] = {**last, "content": begun + text}
    else:
        messages.append({"role": "assistant", "content": text})
    out["messages"] = messages
    if engine in TOLD_TO_CONTINUE:
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    return out


def tokenize_request(engine: str, model: str, text: str) -> JSONObject:
    """What an engine's ``/tokenize`` takes to count ``text`` alone."""
    if engine == "llama.cpp":
        return {"content": text}
    return {"model": model, "prompt": text, "add_special_tokens": False}


def _role_only(body: JSONObject) -> bool:
    """A chunk that only says the answer is the assistant's (a stream's first; vLLM's
    usage in every chunk, when asked, is the answer's so far: nothing is lost)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1:
        return False
    choice = choices[0]
    if not isinstance(choice, dict) or choice.get("finish_reason"):
        return False
    delta = choice.get("delta")
    return (
        isinstance(delta, dict)
        and bool(delta.get("role"))
        and not delta.get("content")
        and all(not v for k, v in delta.items() if k not in ("role", "content"))
    )


def _event(body: JSONObject) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Resume:
    """One streamed request's answer across the replicas that produce it: the bytes
    its client was sent, the request that continues it, and its usage counted once."""

    __slots__ = (
        "model",
        "chat",
        "raw",
        "strip",
        "counts",
        "_record",
        "sent",
        "kept",
        "response",
        "body",
        "parts",
        "carried",
        "prefix_tokens",
        "prompt",
        "owed",
        "first",
        "role_pending",
    )

    def __init__(
        self, model: str, path: str, raw: bytes, strip: bool, record: Record, counts: Counts
    ) -> None:
        self.model = model
        self.chat = path == CHAT_PATH
        self.raw = raw  # the request as the first replica was sent it
        self.strip = strip
        self.counts = counts
        self._record = record
        self.sent: list[bytes] = []  # the client's stream as written
        self.kept = 0
        self.response: web.StreamResponse | None = None
        self.body = raw  # what the next replica is sent
        self.parts = 0  # continuations so far
        self.carried = 0  # content events sent before the current part
        self.prefix_tokens = 0  # those events' text, in the continuing replica's tokens
        self.prompt: int | None = None  # the request's prompt tokens, once counted
        self.owed: str | None = None  # a broken part's replica, its tokens unrecorded
        self.first = Sent()
        self.role_pending = False

    # ------------------------------------------------------------ each write

    def passing(self, out: bytes) -> bytes:
        """What goes to the client of ``out`` (whole events from the tap), kept."""
        if self.parts:
            out = self._rewrite(out)
        if self.chat and out:
            self.kept += len(out)
            if self.kept <= KEEP_MAX:
                self.sent.append(out)
        return out

    def _rewrite(self, out: bytes) -> bytes:
        """A continuation's events as the first stream's: its role chunk dropped, the
        first stream's id and created, the whole answer's usage."""
        events = out.split(b"\n\n")
        rest = events.pop()  # b"" after whole events
        kept: list[bytes] = []
        for event in events:
            body: jsonvalue.JSON = None
            if event.startswith(b"data:") and event[5:].strip() != b"[DONE]":
                try:
                    body = json.loads(event[5:])
                except ValueError:
                    body = None
            if not isinstance(body, dict):
                kept.append(event + b"\n\n")
                continue
            if self.role_pending:
                self.role_pending = False
                if _role_only(body):
                    continue
            first = self.first
            if first.id is not None and "id" in body:
                body["id"] = first.id
                if first.created is not None and "created" in body:
                    body["created"] = first.created
            usage = body.get("usage")
            if isinstance(usage, dict):
                prompt, completion = (usage.get(k) for k in ("prompt_tokens", "completion_tokens"))
                prompt, completion = self.merged(
                    prompt if isinstance(prompt, int) else 0,
                    completion if isinstance(completion, int) else 0,
                )
                usage.update(
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    total_tokens=prompt + completion,
                )
            kept.append(_event(body))
        return b"".join(kept) + rest

    # ---------------------------------------------------------------- usage

    def merged(self, prompt: int, completion: int) -> tuple[int, int]:
        """A part's usage as the whole answer's."""
        if not self.parts:
            return prompt, completion
        if self.prompt is not None:
            return self.prompt, completion + self.carried
        return (max(0, prompt - self.prefix_tokens) if prompt else 0), completion + self.carried

    def record(self, replica: str, prompt: int, completion: int) -> None:
        """The answer's usage, from the part that ended it."""
        self.owed = None
        self._record(replica, *self.merged(prompt, completion))

    def settle(self) -> None:
        """A broken part that nothing continued: what it sent is counted."""
        if self.owed is not None:
            replica, self.owed = self.owed, None
            self._record(replica, self.prompt or 0, self.carried)

    # --------------------------------------------------------- a failure

    async def broke(
        self, endpoint: Endpoint, router: Router, session: aiohttp.ClientSession
    ) -> Endpoint | None:
        """The engine of ``endpoint`` failed mid-stream: the replica to continue on,
        with ``body`` its request; or None, the stream ended here (an error event,
        or its end when nothing was left to say)."""
        sent = read_sent(b"".join(self.sent))
        self.owed = endpoint.replica_id
        self.carried = sent.tokens
        if self.parts == 0:
            self.first = sent
        found: jsonvalue.JSON = json.loads(self.raw) if self.chat else None
        body = found if isinstance(found, dict) else None
        if sent.finished or sent.done:
            # The answer was whole: only its end was lost.
            await self._count(session, body, router.other(self.model, endpoint))
            await self._end(sent, None)
            return None
        if body is None:
            reason: str | None = "not_chat"
        elif self.kept > KEEP_MAX:
            reason = "too_long"
        elif self.parts >= MAX_RESUMES:
            reason = "limit"
        else:
            reason = not_resumable(body, sent, endpoint)
        if reason is not None or body is None:
            await self.fail(reason or "not_chat")
            return None
        if used_up(body, sent.tokens):
            await self._count(session, body, router.other(self.model, endpoint))
            await self._end(sent, "length")
            return None
        nxt = router.pick(self.model, exclude=endpoint)
        if nxt is None:
            await self.fail("no_replica")
            return None
        await self._count(session, body, nxt)
        going_on = continuation(body, sent.text, sent.tokens, nxt.engine)
        assert going_on is not None
        self.prefix_tokens = sent.tokens
        if sent.text:
            request = tokenize_request(nxt.engine, str(body.get("model")), sent.text)
            tokens = await kvroute.tokenize(session, nxt.url, nxt.key, request)
            if tokens is not None:
                self.prefix_tokens = len(tokens)
        self.body = json.dumps(going_on).encode()
        self.parts += 1
        self.role_pending = sent.role
        log.info(
            "%s: stream broke after %d tokens: continued on %s",
            endpoint.replica_id,
            sent.tokens,
            nxt.replica_id,
        )
        return nxt

    async def _count(
        self, session: aiohttp.ClientSession, body: JSONObject | None, on: Endpoint | None
    ) -> None:
        """The request's prompt tokens, counted once, by ``on``'s tokenizer."""
        if self.prompt is not None or body is None or on is None or on.external:
            return
        self.prompt = await kvroute.prompt_tokens(session, on.url, on.key, on.engine, body)

    async def answered(self, answer: web.StreamResponse) -> web.StreamResponse:
        """The answer of a part: a continuation's stream is the client's; a refusal of
        one ends the client's stream with its words."""
        if not self.parts or self.response is None:
            return answer
        if answer is self.response:
            self.counts.resume(self.model)
            return answer
        await self.fail("refused", _words(answer))
        return self.response

    async def fail(self, reason: str, why: str = "") -> None:
        """The stream ends with an error event: it could not be continued."""
        self.counts.fail(self.model, reason)
        message = "the replica serving this answer failed mid-stream, and the answer "
        message += f"could not be continued: {REASONS[reason]}" + (f" ({why})" if why else "")
        log.info("%s: %s", self.model, message)
        if self.response is not None:
            try:
                await stream_error(self.response, message, "stream_interrupted")
            except (ConnectionError, RuntimeError):
                pass  # the client is gone too
        self.settle()

    async def _end(self, sent: Sent, finish: str | None) -> None:
        """End the client's stream as its engine would have: the finish reason (when
        not sent yet), the usage to a client that asked, then [DONE]."""
        first = self.first
        head: JSONObject = {
            "id": first.id,
            "object": "chat.completion.chunk",
            "created": first.created,
            "model": first.model,
        }
        out = b""
        if finish is not None:
            out += _event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if not self.strip and not sent.usage:
            # No engine said the usage: the prompt as counted (0 when none could count).
            prompt = self.prompt or 0
            usage: JSONObject = {"prompt_tokens": prompt, "completion_tokens": self.carried}
            usage["total_tokens"] = prompt + self.carried
            out += _event({**head, "choices": [], "usage": usage})
        if not sent.done:
            out += b"data: [DONE]\n\n"
        if self.response is not None:
            try:
                await self.response.write_eof(out)
            except (ConnectionError, RuntimeError):
                pass
        self.counts.resume(self.model)
        self.settle()


def _words(answer: web.StreamResponse) -> str:
    """An error answer's message, short."""
    body = answer.body if isinstance(answer, web.Response) else None
    if isinstance(body, bytes) and answer.content_type == JSON:
        try:
            error = json.loads(body).get("error")
            message = error.get("message") if isinstance(error, dict) else error
            return str(message)[:300]
        except (ValueError, AttributeError):
            pass
    return f"HTTP {answer.status}"
