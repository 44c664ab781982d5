"""wait_ready against small fake engines on loopback that answer /health as the real
ones do: vLLM does not listen until ready and then answers 200 with an empty body;
SGLang answers 503 until warmed up; llama.cpp 503 "Loading model", then 200 ok."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from llmgw.agent.engines import adapter, wait_ready
from tests.support.ports import free_port


class FakeEngine:
    """/health answered by ``answer()``; every request's Authorization header kept."""

    def __init__(self, answer: Callable[[], web.Response]) -> None:
        self.answer = answer
        self.port = free_port()
        self.seen_auth: list[str | None] = []
        self.runner: web.AppRunner | None = None

    async def health(self, request: web.Request) -> web.Response:
        self.seen_auth.append(request.headers.get("Authorization"))
        return self.answer()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def engines() -> AsyncIterator[list[FakeEngine]]:
    made: list[FakeEngine] = []
    yield made
    for engine in made:
        await engine.stop()


async def test_vllm_ready_once_it_listens(engines: list[FakeEngine]) -> None:
    fake = FakeEngine(lambda: web.Response(status=200))
    engines.append(fake)
    waiting = asyncio.create_task(
        wait_ready(adapter("vllm"), fake.port, timeout=10, key="k1", interval=0.05)
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()  # connection refused is "still starting", not failure
    await fake.start()
    assert await waiting is True
    assert fake.seen_auth == ["Bearer k1"]


async def test_sglang_503_until_warmed_up(engines: list[FakeEngine]) -> None:
    state = {"ready": False}
    fake = FakeEngine(lambda: web.Response(status=200 if state["ready"] else 503))
    engines.append(fake)
    await fake.start()
    waiting = asyncio.create_task(wait_ready(adapter("sglang"), fake.port, 10, interval=0.05))
    await asyncio.sleep(0.3)
    assert not waiting.done() and len(fake.seen_auth) > 1
    state["ready"] = True
    assert await waiting is True


async def test_llamacpp_loading_then_ok(engines: list[FakeEngine]) -> None:
    answers = iter(
        [
            web.json_response(
                {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                status=503,
            ),
            web.json_response({"status": "loading model"}, status=200),
        ]
    )
    fake = FakeEngine(lambda: next(answers, web.json_response({"status": "ok"})))
    engines.append(fake)
    await fake.start()
    assert await wait_ready(adapter("llama.cpp"), fake.port, 10, interval=0.05) is True
    assert len(fake.seen_auth) == 3


async def test_200_that_says_loading_is_never_ready(engines: list[FakeEngine]) -> None:
    fake = FakeEngine(lambda: web.json_response({"status": "loading model"}))
    engines.append(fake)
    await fake.start()
    assert await wait_ready(adapter("llama.cpp"), fake.port, 0.5, interval=0.05) is False


async def test_gives_up_on_a_dead_process_at_once() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await wait_ready(adapter("vllm"), free_port(), 30, alive=lambda: False) is False
    assert loop.time() - started < 1


async def test_gives_up_after_timeout_when_nothing_listens() -> None:
    assert await wait_ready(adapter("sglang"), free_port(), 0.3, interval=0.05) is False
