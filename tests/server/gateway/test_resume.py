"""A stream that survives its replica: the continuation's request for each engine, what
a stream sent read back, the continuation's events rewritten into the first stream, the
usage counted once; and in the gateway, fake engines that die mid-answer."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import RawTestServer

from llmgw.server.gateway.metrics import Metrics, resume_lines
from llmgw.server.gateway.proxy import StreamTap
from llmgw.server.gateway.resume import (
    CHAT_PATH,
    MAX_RESUMES,
    Counts,
    Resume,
    continuation,
    not_resumable,
    read_sent,
)
from llmgw.server.gateway.router import Endpoint
from tests.server.gateway.test_proxy import CHAT, KEY, Harness, harness

ASKED = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 10,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


def chunk(content: str | None = None, role: bool = False, finish: str | None = None, **top: Any):
    delta: dict[str, Any] = {"role": "assistant", "content": None} if role else {}
    if content is not None:
        delta["content"] = content
    return {**top, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


FIRST = {"id": "chatcmpl-first", "created": 100, "model": "m"}
SECOND = {"id": "chatcmpl-second", "created": 200, "model": "m"}


# ------------------------------------------------------------------ the request


def test_the_continuation_for_llama_cpp_and_for_vllm() -> None:
    body = {**ASKED, "max_completion_tokens": 8, "n_predict": -1}
    llama = continuation(body, " the answer", 2, "llama.cpp")
    assert llama is not None
    assert llama["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": " the answer"},
    ]
    # What is left of every spelling of the answer's length; llama.cpp's -1 is no limit.
    assert (llama["max_tokens"], llama["max_completion_tokens"], llama["n_predict"]) == (8, 6, -1)
    # llama.cpp continues a trailing assistant message unasked: nothing else is said.
    assert "continue_final_message" not in llama and "add_generation_prompt" not in llama
    vllm = continuation(body, " the answer", 2, "vllm")
    assert vllm is not None and vllm["messages"] == llama["messages"]
    assert vllm["continue_final_message"] is True and vllm["add_generation_prompt"] is False
    assert body["max_tokens"] == 10 and len(body["messages"]) == 1  # the original untouched


def test_a_client_begun_answer_is_continued_and_a_used_up_one_is_not() -> None:
    begun = {**ASKED, "messages": [*ASKED["messages"], {"role": "assistant", "content": "Sure,"}]}
    going_on = continuation(begun, " here", 1, "llama.cpp")
    assert going_on is not None
    assert going_on["messages"][-1] == {"role": "assistant", "content": "Sure, here"}
    assert len(going_on["messages"]) == 2
    assert continuation(ASKED, "a b c", 10, "vllm") is None  # max_tokens 10, 10 sent
    assert continuation({**ASKED, "max_completion_tokens": 3}, "a b c", 3, "vllm") is None
    # Nothing sent yet: the same request again, nothing to continue.
    assert continuation(ASKED, "", 0, "vllm") == ASKED
    unbounded = continuation({**ASKED, "max_tokens": None}, "x", 1, "llama.cpp")
    assert unbounded is not None and unbounded["max_tokens"] is None


def test_what_a_stream_sent_is_read_back() -> None:
    data = sse(
        chunk(role=True, **FIRST),
        chunk(" one", **FIRST),
        chunk(" two", **FIRST),
        chunk("", **FIRST),
    )
    sent = read_sent(data + b'data: {"choices": [{"delta": {"content": " thr')  # cut
    assert (sent.id, sent.created, sent.model) == ("chatcmpl-first", 100, "m")
    assert sent.text == " one two" and sent.tokens == 2 and sent.role
    assert not (sent.finished or sent.usage or sent.done or sent.tool_calls or sent.reasoning)
    tools = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}
    assert read_sent(sse(tools)).tool_calls
    thinking = {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}
    assert read_sent(sse(thinking)).reasoning
    ended = read_sent(sse(chunk(finish="stop", **FIRST), "[DONE]"))
    assert ended.finished and ended.done


def test_what_cannot_be_continued_says_why() -> None:
    replica = Endpoint("m.default.0", "http://x/v1", "k", 0)
    provider = Endpoint("external:m#1", "http://x/v1", "k", 0, external=True)
    plain = read_sent(sse(chunk(" a")))
    assert not_resumable(ASKED, plain, replica) is None
    assert not_resumable({**ASKED, "n": 1}, plain, replica) is None
    assert not_resumable(ASKED, plain, provider) == "external"
    assert not_resumable({**ASKED, "n": 2}, plain, replica) == "choices"
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}
    assert not_resumable({**ASKED, "response_format": schema}, plain, replica) == "constrained"
    assert not_resumable({**ASKED, "response_format": {"type": "text"}}, plain, replica) is None
    assert not_resumable({**ASKED, "grammar": "root ::= x"}, plain, replica) == "constrained"
    tools = read_sent(sse({"choices": [{"index": 0, "delta": {"tool_calls": [{}]}}]}))
    assert not_resumable(ASKED, tools, replica) == "tool_calls"


# ------------------------------------------------------- the stream, rewritten


class Client:
    """A prepared stream's stand-in: what was written to it."""

    def __init__(self) -> None:
        self.data = b""
        self.ended = False

    async def write(self, data: bytes) -> None:
        self.data += data

    async def write_eof(self, data: bytes = b"") -> None:
        self.data += data
        self.ended = True


def resume_of(
    body: dict[str, Any], strip: bool = False, path: str = CHAT_PATH
) -> tuple[Resume, list[tuple[str, int, int]], Counts, Client]:
    recorded: list[tuple[str, int, int]] = []
    counts = Counts()
    resume = Resume(
        "m",
        path,
        json.dumps(body).encode(),
        strip,
        lambda replica, prompt, completion: recorded.append((replica, prompt, completion)),
        counts,
    )
    client = Client()
    resume.response = client  # type: ignore[assignment]
    return resume, recorded, counts, client


def router_of(*endpoints: Endpoint) -> Any:
    def pick(model: str, exclude: Endpoint | None = None) -> Endpoint | None:
        return next((e for e in endpoints if e is not exclude), None)

    return SimpleNamespace(pick=pick, other=pick)


async def tokenizer(tokens: int, prompt: int | None = None) -> tuple[RawTestServer, str]:
    """An engine's /tokenize answering ``tokens`` tokens for a text, and ``prompt`` for a
    chat's messages (vLLM's; 400 when None: a tokenizer that takes no messages)."""

    async def answer(request: web.BaseRequest) -> web.Response:
        assert request.path == "/tokenize"
        assert request.headers["Authorization"] == "Bearer key-b"
        asked = await request.json()
        if "messages" in asked:
            if prompt is None:
                return web.json_response({"error": "no messages here"}, status=400)
            assert asked["add_generation_prompt"] is True and "continue_final_message" not in asked
            assert asked["messages"] == ASKED["messages"]  # the request's own, not continued
            return web.json_response({"count": prompt, "tokens": list(range(prompt))})
        return web.json_response({"tokens": list(range(tokens))})

    server = RawTestServer(answer)
    await server.start_server()
    return server, str(server.make_url("/v1"))


async def test_a_continuation_passes_as_the_first_stream_with_the_whole_usage() -> None:
    resume, recorded, counts, client = resume_of(ASKED)
    first = sse(chunk(role=True, **FIRST), chunk(" one", **FIRST), chunk(" two", **FIRST))
    assert resume.passing(first) == first  # the healthy path: passed as it came
    server, url = await tokenizer(3)  # its tokenizer counts " one two" as 3 tokens
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key-a", 0)
    b = Endpoint("m.default.b", url, "key-b", 0, engine="vllm")
    try:
        async with aiohttp.ClientSession() as session:
            nxt = await resume.broke(a, router_of(a, b), session)
    finally:
        await server.close()
    assert nxt is b and resume.parts == 1
    sent = json.loads(resume.body)
    assert sent["messages"][-1] == {"role": "assistant", "content": " one two"}
    assert sent["max_tokens"] == 8 and sent["continue_final_message"] is True

    usage = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
    second = sse(
        chunk("", role=True, **SECOND),  # vLLM's role chunk: an empty content
        chunk(" three", **SECOND),
        chunk(finish="length", **SECOND),
        {**SECOND, "choices": [], "usage": usage},
        "[DONE]",
    )
    tap = StreamTap(strip=False)  # cut anywhere, it passes whole events on
    out = resume.passing(tap.feed(second[:50])) + resume.passing(tap.feed(second[50:]))
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert out.endswith(b"data: [DONE]\n\n")
    assert [e["id"] for e in events] == ["chatcmpl-first"] * 3  # the role chunk dropped
    assert {e["created"] for e in events} == {100}
    assert events[0]["choices"][0]["delta"] == {"content": " three"}
    # The prompt less the 3 tokens continued; the 2 sent before plus the 8 after.
    assert events[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 10, "total_tokens": 19}
    assert await resume.answered(client) is client  # type: ignore[arg-type]
    resume.record("m.default.b", 12, 8)  # the part that ended it, as the tap read it
    assert recorded == [("m.default.b", 9, 10)]
    assert counts.resumed == {"m": 1} and counts.failed == {}


async def test_a_stream_cut_twice_keeps_one_id_and_counts_every_part() -> None:
    resume, recorded, counts, client = resume_of(ASKED, strip=True)
    resume.passing(sse(chunk(role=True, **FIRST), chunk(" a", **FIRST)))
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key", 0)
    b = Endpoint("m.default.b", "http://127.0.0.1:1/v1", "key", 0)
    async with aiohttp.ClientSession() as session:
        assert await resume.broke(a, router_of(a, b), session) is b
        # No tokenizer answered: the content events sent are the prefix's tokens.
        assert resume.prefix_tokens == 1
        out = resume.passing(sse(chunk(role=True, **SECOND), chunk(" b", **SECOND)))
        assert [json.loads(e[6:])["id"] for e in out.split(b"\n\n") if e] == ["chatcmpl-first"]
        assert await resume.broke(b, router_of(a, b), session) is a
        assert json.loads(resume.body)["messages"][-1]["content"] == " a b"
        assert json.loads(resume.body)["max_tokens"] == 8
        assert resume.carried == 2 and resume.parts == 2
        resume.passing(sse(chunk(role=True, id="x", created=1), chunk(" c", id="x", created=1)))
        # A third failure: continued MAX_RESUMES times already, the stream ends with why.
        assert MAX_RESUMES == 2
        assert await resume.broke(a, router_of(a, b), session) is None
    error = json.loads(client.data.split(b"\n\n")[0][6:])["error"]
    assert error["code"] == "stream_interrupted" and "continued 2 times" in error["message"]
    assert client.ended and counts.failed == {("m", "limit"): 1}
    assert recorded == [("m.default.a", 0, 3)]  # what the three parts sent, once


async def test_with_nothing_left_to_say_the_stream_just_ends() -> None:
    resume, recorded, counts, client = resume_of({**ASKED, "max_tokens": 2})
    resume.passing(sse(chunk(role=True, **FIRST), chunk(" a", **FIRST), chunk(" b", **FIRST)))
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key", 0)
    async with aiohttp.ClientSession() as session:
        assert await resume.broke(a, router_of(a, a), session) is None
    events = [e for e in client.data.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and client.ended
    finish, usage = (json.loads(e[6:]) for e in events[:2])
    assert finish["id"] == "chatcmpl-first" and finish["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == 2
    assert recorded == [("m.default.a", 0, 2)] and counts.resumed == {"m": 1}


async def test_streams_that_are_not_continued_end_with_an_error_event() -> None:
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key", 0)
    cases: list[tuple[dict[str, Any], str, Any]] = [
        (ASKED, "/v1/completions", router_of(a, a)),
        ({**ASKED, "n": 3}, CHAT_PATH, router_of(a, a)),
        (ASKED, CHAT_PATH, router_of(a)),  # no other replica
    ]
    for body, path, router in cases:
        resume, recorded, counts, client = resume_of(body, path=path)
        resume.passing(sse(chunk(role=True, **FIRST), chunk(" a", **FIRST)))
        async with aiohttp.ClientSession() as session:
            assert await resume.broke(a, router, session) is None
        assert b'"stream_interrupted"' in client.data and client.ended
        ((_, reason),) = counts.failed
        assert reason in ("not_chat", "choices", "no_replica")
        # Not kept for a continuation, a completions stream counts no content events.
        assert recorded == [("m.default.a", 0, 1 if path == CHAT_PATH else 0)]


def test_the_counts_are_prometheus_text() -> None:
    lines = resume_lines({"m": 2}, {("m", "no_replica"): 1, ("m", "refused"): 3})
    text = Metrics().render({}, {}, lines)
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
    assert "# TYPE llmgw_gateway_stream_resumed_total counter" in text
    assert 'llmgw_gateway_stream_resumed_total{model="m"} 2' in text
    assert 'llmgw_gateway_stream_resume_failures_total{model="m",reason="no_replica"} 1' in text


# ------------------------------------------------------------------ in the gateway


async def stream(h: Harness, body: dict[str, Any]) -> tuple[list[Any], str]:
    """The client's events (JSON, or the text of those that are not) and the raw text."""
    async with h.http.post(
        h.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=aiohttp.ClientTimeout(total=10),
    ) as resp:
        assert resp.status == 200
        text = await resp.text()
    events: list[Any] = []
    for event in text.split("\n\n"):
        if event.startswith("data: "):
            payload = event[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events, text


def first_to_zero(h: Harness) -> None:
    """The first pick goes to engine 0: engine 1 looks busy (the continuation's pick,
    which excludes the failed replica, takes it all the same)."""
    h.gateway.router.endpoints_of("m")[1].outstanding += 1


async def test_a_stream_whose_replica_dies_goes_on_from_another(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        first_to_zero(h)
        h.engines[0].dies_after = 3
        events, text = await stream(h, ASKED)
        h.gateway.router.endpoints_of("m")[1].outstanding -= 1
        chunks = [e for e in events if isinstance(e, dict)]
        assert events[-1] == "[DONE]" and text.count("[DONE]") == 1
        assert len({e["id"] for e in chunks}) == 1  # one stream, the first engine's id
        assert chunks[0]["id"] == f"chatcmpl-{h.engines[0].port}-1"
        roles = [e for e in chunks if e["choices"] and "role" in e["choices"][0]["delta"]]
        assert len(roles) == 1 and roles[0] is chunks[0]
        contents = [
            e["choices"][0]["delta"]["content"]
            for e in chunks
            if e["choices"] and e["choices"][0]["delta"].get("content")
        ]
        assert contents == ["t0", "t1", "t2", "t0", "t1", "t2", "t3", "t4"]
        assert [e["choices"][0]["finish_reason"] for e in chunks if e["choices"]][-1] == "length"
        # The usage once: the original prompt's 7 tokens, the 3 sent before and 5 after.
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 7,
            "completion_tokens": 8,
            "total_tokens": 15,
        }
        going_on = h.engines[1].requests[-1]
        assert going_on["messages"][-1] == {"role": "assistant", "content": "t0t1t2"}
        assert going_on["max_tokens"] == 7
        assert h.gateway.usage.pending == {("k1", "m", "m.default.00000001"): [1, 7, 8]}
        assert h.gateway.router.failures == {("m", "m.default.00000000"): 1}
        assert h.gateway.upstream.resumes.resumed == {"m": 1}
        metrics = await h.gateway.metrics_text()
        assert 'llmgw_gateway_stream_resumed_total{model="m"} 1' in metrics


async def test_a_continued_stream_keeps_its_usage_from_a_client_that_did_not_ask(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path) as h:
        first_to_zero(h)
        h.engines[0].dies_after = 2
        events, text = await stream(h, {**ASKED, "stream_options": None})
        assert '"usage"' not in text and events[-1] == "[DONE]"
        assert h.gateway.usage.pending == {("k1", "m", "m.default.00000001"): [1, 7, 7]}


async def test_with_no_other_replica_a_broken_stream_ends_with_an_error_event(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, replicas=1) as h:
        h.engines[0].dies_after = 2
        events, _ = await stream(h, ASKED)
        assert events[-1]["error"]["code"] == "stream_interrupted"
        assert "no other replica" in events[-1]["error"]["message"]
        assert h.gateway.upstream.resumes.failed == {("m", "no_replica"): 1}
        assert h.gateway.router.failures == {("m", "m.default.00000000"): 1}
        assert h.gateway.usage.pending == {("k1", "m", "m.default.00000000"): [1, 0, 2]}


async def test_a_replica_dying_before_its_plain_answer_is_retried_on_another(
    tmp_path: Path,
) -> None:
    """The request was sent, the engine died before answering: the connection is reset
    with nothing back, the same replica refuses the new one, and the next answers."""
    async with harness(tmp_path) as h:
        first_to_zero(h)
        h.engines[0].dies_after = 0
        status, body = await h.post({**CHAT, "max_tokens": 4})
        h.gateway.router.endpoints_of("m")[1].outstanding -= 1
        assert status == 200 and body["choices"][0]["message"]["content"] == "ok"
        assert len(h.engines[0].requests) == 1 and len(h.engines[1].requests) == 1
        assert h.gateway.router.failures == {("m", "m.default.00000000"): 1}


async def test_a_client_that_leaves_mid_stream_is_no_failure_of_the_replica(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, replicas=1) as h:
        h.engines[0].tokens = 100_000  # still streaming when the client has gone
        async with h.http.post(
            h.url + "/v1/chat/completions", json=ASKED, headers={"Authorization": f"Bearer {KEY}"}
        ) as resp:
            assert b"t0" in await resp.content.readuntil(b"t0")
            resp.close()
        # The request's usage is recorded when its way through the gateway ends.
        for _ in range(500):
            if h.gateway.usage.pending:
                break
            await asyncio.sleep(0.02)
        assert h.gateway.usage.pending
        assert h.gateway.router.failures == {}
        resumes = h.gateway.upstream.resumes
        assert resumes.resumed == {} and resumes.failed == {}


# ------------------------------------------------- the request's own prompt tokens


async def llama_tokenizer(prompt: int) -> tuple[RawTestServer, str, list[Any]]:
    """llama.cpp's /apply-template and /tokenize: the request's messages rendered, then
    ``prompt`` tokens for the rendered text with its BOS; a word a token otherwise."""
    asked: list[Any] = []
    rendered = "<|user|>hi<|assistant|>"

    async def answer(request: web.BaseRequest) -> web.Response:
        assert request.headers["Authorization"] == "Bearer key-b"
        body = await request.json()
        asked.append((request.path, body))
        if request.path == "/apply-template":
            assert body == {"messages": ASKED["messages"]}
            return web.json_response({"prompt": rendered})
        assert request.path == "/tokenize"
        if body["content"] == rendered:
            assert body["add_special"] is True  # counted with its BOS, as for an answer
            return web.json_response({"tokens": list(range(prompt))})
        return web.json_response({"tokens": list(range(len(body["content"].split())))})

    server = RawTestServer(answer)
    await server.start_server()
    return server, str(server.make_url("/v1")), asked


async def test_a_continued_streams_usage_has_the_requests_own_prompt_tokens() -> None:
    """The continuation's prompt holds what it continues: its engine's count less the
    prefix's was the prompt only to a token, and 0 when the prefix counted more. The
    request's own prompt, counted by the continuing replica, is the usage's."""
    resume, recorded, _, _ = resume_of(ASKED)
    resume.passing(sse(chunk(role=True, **FIRST), chunk(" one", **FIRST), chunk(" two", **FIRST)))
    server, url = await tokenizer(50, prompt=9)  # the prefix tokenized: more than it is
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key-a", 0)
    b = Endpoint("m.default.b", url, "key-b", 0, engine="vllm")
    try:
        async with aiohttp.ClientSession() as session:
            assert await resume.broke(a, router_of(a, b), session) is b
    finally:
        await server.close()
    assert resume.prompt == 9
    usage = {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}
    out = resume.passing(sse(chunk(" three", **SECOND), {**SECOND, "choices": [], "usage": usage}))
    events = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert events[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 10, "total_tokens": 19}
    resume.record("m.default.b", 30, 8)
    assert recorded == [("m.default.b", 9, 10)]


async def test_a_stream_the_gateway_ends_itself_reports_its_prompt_tokens() -> None:
    """An answer whose length was used up when its replica broke, and one that was whole
    (only its end lost): no engine says their usage, so the gateway does, with the
    prompt counted by another replica of the model (llama.cpp here)."""
    server, url, asked = await llama_tokenizer(28)
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key-a", 0, engine="llama.cpp")
    b = Endpoint("m.default.b", url, "key-b", 0, engine="llama.cpp")
    try:
        for body, events in (
            ({**ASKED, "max_tokens": 2}, [chunk(" a", **FIRST), chunk(" b", **FIRST)]),
            (ASKED, [chunk(" a", **FIRST), chunk(" b", finish="stop", **FIRST)]),
        ):
            resume, recorded, counts, client = resume_of(body)
            resume.passing(sse(chunk(role=True, **FIRST), *events))
            async with aiohttp.ClientSession() as session:
                assert await resume.broke(a, router_of(a, b), session) is None
            usage = [json.loads(e[6:]) for e in client.data.split(b"\n\n") if b'"usage"' in e]
            assert [u["usage"] for u in usage] == [
                {"prompt_tokens": 28, "completion_tokens": 2, "total_tokens": 30}
            ]
            assert recorded == [("m.default.a", 28, 2)] and counts.resumed == {"m": 1}
    finally:
        await server.close()
    assert [path for path, _ in asked] == ["/apply-template", "/tokenize"] * 2


async def test_with_no_tokenizer_answering_the_prompt_is_what_it_always_was() -> None:
    resume, recorded, _, client = resume_of({**ASKED, "max_tokens": 1})
    resume.passing(sse(chunk(role=True, **FIRST), chunk(" a", **FIRST)))
    a = Endpoint("m.default.a", "http://127.0.0.1:1/v1", "key", 0, engine="llama.cpp")
    b = Endpoint("m.default.b", "http://127.0.0.1:1/v1", "key", 0, engine="llama.cpp")
    async with aiohttp.ClientSession() as session:
        assert await resume.broke(a, router_of(a, b), session) is None
    assert resume.prompt is None and recorded == [("m.default.a", 0, 1)]
