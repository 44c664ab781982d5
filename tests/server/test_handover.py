"""The listener handed over across a start in place (``llmgw.server.handover``), in one
process: a request in flight when the listener stops is answered by the old one, a
client that connects between the two is answered by the next one, and none is refused."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from aiohttp import web

from llmgw.server import handover
from llmgw.server.front import Listener
from tests.e2e.cluster import free_port


def answering(words: str, release: asyncio.Event | None = None) -> Listener:
    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        if release is not None and request.path == "/slow":
            await release.wait()
        return web.Response(text=words)

    return Listener(f"127.0.0.1:{PORT[0]}", handler, handler)


PORT = [0]


async def ask(path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", PORT[0])
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_no_client_is_refused_while_the_listener_is_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    PORT[0] = free_port()
    release = asyncio.Event()
    old = answering("old", release)
    await old.start()
    in_flight = asyncio.create_task(ask("/slow"))
    await asyncio.sleep(0.2)  # the request is in the handler (it waits for release)
    assert not in_flight.done()

    fds = old.hand_over()
    stopping = asyncio.create_task(old.stop())
    # aiohttp stops accepting first, then waits for the request in flight.
    runner = old.runner
    assert runner is not None
    while runner.sites:
        await asyncio.sleep(0.01)
    between = asyncio.create_task(ask("/"))  # connects while nobody accepts
    release.set()
    assert (await in_flight).endswith(b"old")
    await stopping

    monkeypatch.setenv(handover.ENV, handover.Handover({old.address: fds}).env()[handover.ENV])
    taken = handover.inherited()
    assert handover.ENV not in os.environ  # taken once, never passed to a child
    new = answering("new")
    await new.start(taken.pop(new.address))
    try:
        assert (await between).endswith(b"new")
        assert (await ask("/")).endswith(b"new")
    finally:
        await new.stop()
    with pytest.raises(ConnectionRefusedError):
        await ask("/")  # stopped without a hand-over: closed


def test_a_handed_over_descriptor_that_is_gone_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    sock = socket.socket()
    fd = os.dup(sock.fileno())
    sock.close()
    os.close(fd)
    monkeypatch.setenv(handover.ENV, f'{{"127.0.0.1:1": [{fd}]}}')
    assert handover.inherited() == {}
    monkeypatch.setenv(handover.ENV, "not json")
    assert handover.inherited() == {}


async def test_a_keep_alive_client_asking_through_the_drain_loses_no_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race HTTP/1.1 keep-alive leaves: a server that closes a kept-alive connection as
    its client sends on it loses that request. Draining, the old listener answers what
    each connection asks with ``Connection: close`` and closes only connections idle a
    while, so a client asking without pause (as the openai SDK's pool does) is told to go
    and goes to the next listener; an idle connection is closed."""
    import httpx

    PORT[0] = free_port()
    old = answering("old")
    await old.start()
    answers: list[bytes] = []
    errors: list[BaseException] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT[0]}") as client:

        async def keep_asking() -> None:
            while not stop.is_set():
                try:
                    answers.append((await client.get("/")).content)
                except httpx.HTTPError as exc:
                    errors.append(exc)

        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", PORT[0])
        askers = [asyncio.create_task(keep_asking()) for _ in range(4)]
        while len(answers) < 40:
            await asyncio.sleep(0.01)
        fds = old.hand_over()
        await old.drain(within=5)
        # Every connection has ended: the askers' after an answer that said so, the idle
        # one closed by the listener (its reader sees the end).
        assert old.server is not None and not old.server.open
        assert await asyncio.wait_for(idle_reader.read(), 1) == b""
        idle_writer.close()
        await old.stop()
        monkeypatch.setenv(handover.ENV, handover.Handover({old.address: fds}).env()[handover.ENV])
        new = answering("new")
        await new.start(handover.inherited().pop(new.address))
        try:
            while answers[-1] != b"new":
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.gather(*askers)
        finally:
            await new.stop()
    assert errors == []
    assert set(answers) == {b"old", b"new"}
