"""A fake OpenAI-compatible engine on a bare asyncio server, for the gateway's own tests.

It speaks HTTP/1.1 by hand so it can behave as llama.cpp's server does where that
matters to the gateway: it announces keep-alive and still closes the connection after a
streamed answer (``close_after_stream``), and it answers 500 with its JSON library's
parse error to a body it cannot read. A request picks its answer with ``x_mode``:
``ok`` (the default), ``client_error`` (400), ``parse_error`` (500, about the request),
``not_supported`` (501), ``crash`` (500, the engine's own failure), ``slow`` (answers
after ``x_delay`` seconds, or not at all when the client hangs up first), ``held``
(answers once the test lets it go: ``engine.hold.release()``, one answer each).
A stream opens with a role-only chunk and gives each event an ``id``, as llama.cpp's and
vLLM's do. An engine whose ``dies_after`` is set dies on its next request as a killed
process does (its port closed, its connections cut): after that many content events of
a stream, or before a plain answer. Its words are ``t0``, ``t1``, ...: ``/tokenize``
counts them, and a trailing assistant message (an answer to continue) adds them to
the prompt's 7 tokens.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

WORD = re.compile(r"t\d+")
PARSE_ERROR = (
    "[json.exception.parse_error.101] parse error at line 1, column 40: syntax error "
    "while parsing value - invalid literal; last read: 'N'"
)


class FakeEngine:
    def __init__(self, close_after_stream: bool = True, tokens: int = 5) -> None:
        self.close_after_stream = close_after_stream
        self.tokens = tokens
        self.server: asyncio.Server | None = None
        self.port = 0
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self.closing = False
        # Answers asked for with x_mode "held" wait for one release each.
        self.hold = asyncio.Semaphore(0)
        self.dies_after: int | None = None

    async def start(self) -> FakeEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self._writers):
                writer.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length", "0"))
                raw = await reader.readexactly(length) if length else b""
                self.closing = headers.get("connection", "").lower() == "close"
                keep = await self._answer(method, path, raw, reader, writer)
                if not keep or self.closing:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(
        self,
        method: str,
        path: str,
        raw: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if method == "GET" and path == "/health":
            self._send(writer, 200, {"status": "ok"})
            return True
        body = json.loads(raw) if raw else {}
        if path == "/tokenize":
            text = body.get("content") or body.get("prompt") or ""
            self._send(writer, 200, {"tokens": list(range(len(WORD.findall(text))))})
            return True
        self.requests.append(body)
        mode = body.get("x_mode", "ok")
        if mode == "client_error":
            error = {"code": 400, "message": "bad field", "type": "invalid_request_error"}
            self._send(writer, 400, {"error": error})
            return True
        if mode == "not_supported":
            error = {"code": 501, "message": "start it with --embeddings", "type": "unsupported"}
            self._send(writer, 501, {"error": error})
            return True
        if mode == "parse_error":
            self._send(writer, 500, {"error": {"code": 500, "message": PARSE_ERROR}})
            return True
        if mode == "crash":
            self._send(writer, 500, {"error": {"code": 500, "message": "out of memory"}})
            return True
        if mode == "slow":
            # Working, as an engine does, while watching for the client to hang up.
            try:
                gone = await asyncio.wait_for(reader.read(1), float(body.get("x_delay", 5)))
            except TimeoutError:
                gone = b"still here"
            if not gone:
                self.cancelled += 1
                return False
        if mode == "held":
            await self.hold.acquire()
        messages = body.get("messages") or [{}]
        prefill = messages[-1].get("content") if messages[-1].get("role") == "assistant" else ""
        prompt = 7 + len(WORD.findall(prefill or ""))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": self.tokens,
            "total_tokens": prompt + self.tokens,
        }
        if self.dies_after is not None and not body.get("stream"):
            self._die()
            return False
        if not body.get("stream"):
            self._send(
                writer,
                200,
                {"choices": [{"message": {"content": "ok"}, "index": 0}], "usage": usage},
            )
            return True
        # As llama.cpp's does: keep-alive announced, unless the client asked to close.
        connection = b"Connection: close" if self.closing else b"Keep-Alive: timeout=5, max=100"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            + connection
            + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        role = {"role": "assistant", "content": None}
        events = [{"choices": [{"delta": role, "index": 0, "finish_reason": None}]}]
        events += [
            {"choices": [{"delta": {"content": f"t{i}"}, "index": 0, "finish_reason": None}]}
            for i in range(self.tokens)
        ]
        events.append({"choices": [{"delta": {}, "index": 0, "finish_reason": "length"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({"choices": [], "usage": usage})
        head = {"id": f"chatcmpl-{self.port}-{len(self.requests)}", "created": self.port}
        for i, event in enumerate(events):
            if i - 1 == self.dies_after:
                self._die()
                return False
            self._chunk(writer, b"data: " + json.dumps({**head, **event}).encode() + b"\n\n")
            await writer.drain()
        self._chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        if self.close_after_stream:
            # As llama.cpp's does: the close comes a moment after the answer, so a client
            # may already have sent its next request on the connection.
            await asyncio.sleep(0.05)
        return not self.close_after_stream

    def _die(self) -> None:
        self.dies_after = None
        if self.server is not None:
            self.server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        reasons = {200: "OK", 400: "Bad Request", 500: "Internal Server Error", 501: "No"}
        reason = reasons[status]
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Keep-Alive: timeout=5, max=100\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
