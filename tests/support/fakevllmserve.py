"""A fake ``vllm serve``: vLLM's HTTP edges and its KV events, without a model.

Run as ``python -m tests.support.fakevllmserve serve MODEL --port P ...`` (the agent's
command line for vLLM, ``--kv-events-config`` included). It answers ``/health``,
``/v1/models`` (to ``VLLM_API_KEY`` alone), ``/tokenize`` and ``/v1/chat/completions``
and ``/v1/completions``, and like vLLM's prefix cache it stores each full block of a
prompt it served, publishing ``BlockStored`` for the new ones (and ``BlockRemoved`` when
its small cache evicts) through ``tests.support.fakevllm.FakeVllm``, in vLLM's wire
format. Block hashes follow vLLM's rules, computed here with cbor2 and hashlib apart
from llmgw's own code: ``sha256(cbor2.dumps((parent, tuple(tokens), None),
canonical=True))``, the chain rooted at ``sha256(cbor2.dumps(PYTHONHASHSEED))``, and
published as the digest's low 64 bits.

Tokens are the prompt's UTF-8 bytes plus 1000; a chat is rendered ``<role>content``
per message, then ``<assistant>`` for the answer. Answers say which port served them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from collections import OrderedDict
from typing import Any

import cbor2
from aiohttp import web

from tests.support.fakevllm import FakeVllm, Removed, Stored

BLOCK_SIZE = 16


def tokens_of(body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if isinstance(messages, list):
        text = "".join(f"<{m.get('role')}>{m.get('content')}" for m in messages)
        if body.get("add_generation_prompt", True):
            text += "<assistant>"
    else:
        text = str(body.get("prompt", ""))
    return [b + 1000 for b in text.encode()]


def block_hashes(tokens: list[int], seed: str) -> list[int]:
    parent = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    out = []
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = (parent, tuple(tokens[start : start + BLOCK_SIZE]), None)
        parent = hashlib.sha256(cbor2.dumps(block, canonical=True)).digest()
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


class Engine:
    def __init__(self, port: int, name: str, publisher: FakeVllm | None, capacity: int) -> None:
        self.port = port
        self.name = name
        self.publisher = publisher
        self.capacity = capacity
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.key = os.environ.get("VLLM_API_KEY", "")
        self.seed = os.environ.get("PYTHONHASHSEED", "")

    def authorised(self, request: web.Request) -> bool:
        return not self.key or request.headers.get("Authorization") == f"Bearer {self.key}"

    async def remember(self, tokens: list[int]) -> None:
        """Cache the prompt's full blocks as vLLM's prefix cache does, and say so."""
        hashes = block_hashes(tokens, self.seed)
        new = [h for h in hashes if h not in self.cache]
        for h in hashes:
            self.cache[h] = None
            self.cache.move_to_end(h)
        evicted = []
        while len(self.cache) > self.capacity:
            evicted.append(self.cache.popitem(last=False)[0])
        if self.publisher is None:
            return
        events: list[Stored | Removed] = []
        if new:
            events.append(Stored(new, block_size=BLOCK_SIZE))
        if evicted:
            events.append(Removed(evicted))
        if events:
            await self.publisher.publish(*events)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="# fake vllm\n")

    async def models(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": self.name}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        if not self.authorised(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        tokens = tokens_of(await request.json())
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": 8192})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        if not self.authorised(request):
            return web.json_response({"error": "Unauthorized"}, status=401)
        body = await request.json()
        tokens = tokens_of(body)
        await self.remember(tokens)
        text = f"served by port {self.port}"
        usage = {"prompt_tokens": len(tokens), "completion_tokens": 4, "total_tokens": 4}
        usage["total_tokens"] += len(tokens)
        chat = "messages" in body
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            delta = {"delta": {"content": text}} if chat else {"text": text}
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [delta]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            final = {"id": "x", "choices": [], "usage": usage}
            await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "stop"}
        )
        return web.json_response({"id": "x", "choices": [choice], "usage": usage})


async def serve(args: argparse.Namespace) -> None:
    publisher = None
    if args.kv_events_config:
        config = json.loads(args.kv_events_config)
        port = int(config["endpoint"].rsplit(":", 1)[1])
        replay = int(config["replay_endpoint"].rsplit(":", 1)[1])
        publisher = FakeVllm(port, replay, encoding=os.environ.get("FAKE_VLLM_ENCODING", "map"))  # type: ignore[arg-type]
        await publisher.start()
    engine = Engine(args.port, args.served_model_name or args.model, publisher, args.blocks)
    app = web.Application()
    app.router.add_get("/health", engine.health)
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_post("/tokenize", engine.tokenize)
    app.router.add_post("/v1/chat/completions", engine.answer)
    app.router.add_post("/v1/completions", engine.answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"fake vllm serving {args.model} on {args.host}:{args.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--kv-events-config")
    parser.add_argument(
        "--blocks", type=int, default=int(os.environ.get("FAKE_VLLM_BLOCKS", "4096"))
    )
    args, _rest = parser.parse_known_args(sys.argv[1:])
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
