"""A fake OpenAI-compatible engine for the gateway benchmark: fast enough not to matter.

A bare ``asyncio.Protocol`` HTTP/1.1 server with keep-alive (request line, headers and
a Content-Length body parsed by hand; no framework), answering every completion with the
same prepared bytes:

- ``POST /v1/chat/completions`` and ``/v1/completions``: a fixed chat completion with
  usage, or with ``"stream": true`` 20 SSE chunks (chunked transfer encoding, one write
  each, as an engine sends tokens) and ``data: [DONE]``;
- ``GET /health``: 200 ``{"status":"ok"}`` (llama-server's readiness answer);
- ``GET /v1/models``: the model, 401 without the key (the agent's adoption check);
- ``GET /metrics``: a few Prometheus lines.

It takes llama-server's command line (``-m``, ``--host``, ``--port``, ``--alias`` and the
rest, unknown flags ignored) and its key from ``LLAMA_API_KEY``, and ``--version`` prints
``version: 1 (fa4e001)``, so an llmgw agent runs it as llama.cpp through a two-line
wrapper script. With no key set, every request is answered.

    .venv/bin/python bench/fake_engine.py --host 127.0.0.1 --port 8901
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

CHUNKS = 20
_REASONS = {200: b"OK", 401: b"Unauthorized", 404: b"Not Found", 400: b"Bad Request"}


def _response(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        b"Connection: keep-alive\r\n\r\n"
        % (status, _REASONS.get(status, b"Error"), content_type, len(body))
        + body
    )


class Answers:
    """Every answer's bytes, made once."""

    def __init__(self, model: str) -> None:
        created = int(time.time())
        completion = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "word " * CHUNKS},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": CHUNKS, "total_tokens": 9 + CHUNKS},
        }
        self.completion = _response(200, json.dumps(completion).encode())
        self.health = _response(200, b'{"status":"ok"}')
        models = {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "fake"}]}
        self.models = _response(200, json.dumps(models).encode())
        self.metrics = _response(200, b"llamacpp:requests_processing 0\n", b"text/plain")
        self.unauthorised = _response(
            401,
            b'{"error":{"message":"Invalid API Key","type":"authentication_error",'
            b'"param":null,"code":401}}',
        )
        self.not_found = _response(404, b'{"error":{"message":"not found","type":"not_found"}}')
        self.bad = _response(400, b'{"error":{"message":"bad request","type":"invalid_request"}}')
        # A stream: the head, then one chunked-encoding frame per SSE event, then the end.
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )
        events = []
        for i in range(CHUNKS):
            last = i == CHUNKS - 1
            chunk: dict[str, object] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "word "} if not last else {},
                        "finish_reason": "stop" if last else None,
                    }
                ],
            }
            if last:
                chunk["usage"] = completion["usage"]
            events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        # Asked to close (as llmgw asks llama.cpp after a stream), it says so, as llama.cpp
        # does: RFC 9112 9.6.
        self.stream_head_closing = self.stream_head.replace(
            b"Connection: keep-alive", b"Connection: close"
        )
        self.stream_frames = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
        self.stream_frames[-1] += b"0\r\n\r\n"


class EngineProtocol(asyncio.Protocol):
    """One connection: requests parsed as they arrive, answered in order."""

    __slots__ = ("answers", "key", "transport", "buffer")

    def __init__(self, answers: Answers, key: bytes | None) -> None:
        self.answers = answers
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # the client went away; answering would only log failed sends
        buffer = self.buffer + data if self.buffer else data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end].split(b"\r\n")
            length = 0
            auth = b""
            close = False
            for line in head[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"authorization":
                    auth = value.strip()
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
            if len(buffer) < end + 4 + length:
                break
            body = buffer[end + 4 : end + 4 + length]
            buffer = buffer[end + 4 + length :]
            self.answer(head[0], auth, body, close)
            if close:
                assert self.transport is not None
                self.transport.close()
                buffer = b""
                break
        self.buffer = buffer

    def answer(self, request_line: bytes, auth: bytes, body: bytes, close: bool = False) -> None:
        transport = self.transport
        assert transport is not None
        parts = request_line.split(b" ")
        if len(parts) != 3:
            transport.write(self.answers.bad)
            return
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        answers = self.answers
        if path == b"/health":
            transport.write(answers.health)
            return
        if self.key is not None and auth != b"Bearer " + self.key:
            transport.write(answers.unauthorised)
            return
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            if b'"stream"' in body and _streamed(body):
                transport.write(answers.stream_head_closing if close else answers.stream_head)
                for frame in answers.stream_frames:
                    transport.write(frame)
            else:
                transport.write(answers.completion)
        elif path == b"/v1/models":
            transport.write(answers.models)
        elif path == b"/metrics":
            transport.write(answers.metrics)
        else:
            transport.write(answers.not_found)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def _streamed(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("stream"))
    except (ValueError, AttributeError):
        return False


async def serve(host: str, port: int, model: str, key: bytes | None) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers(model)
    server = await loop.create_server(
        lambda: EngineProtocol(answers, key), host, port, backlog=1024, reuse_address=True
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # What llama-server prints as it starts, so the agent's start-up reading sees a CPU run.
    print(f"system_info: n_threads = 1 | fake engine on {host}:{port}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--alias", default="tiny", help="the model's name in answers")
    parser.add_argument("-m", "--model", default=None, help="ignored (llama-server's model)")
    parser.add_argument("--version", action="store_true", help="print a llama.cpp version")
    args, _unknown = parser.parse_known_args(argv)
    if args.version:
        print("version: 1 (fa4e001)\nbuilt with a fake for llmgw's gateway benchmark")
        return 0
    key = os.environ.get("LLAMA_API_KEY") or None
    asyncio.run(serve(args.host, args.port, args.alias, key.encode() if key else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
