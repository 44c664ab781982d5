"""What every page's form reading refuses: a form too slow to arrive, too large, or of
another kind."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from llmgw.server.pages.frame import read_form
from llmgw.server.refusal import Refusal


def request(chunks: list[bytes], headers: dict[str, str], stall: bool = False) -> Request:
    queue = list(chunks)

    async def receive() -> dict[str, object]:
        if queue:
            return {"type": "http.request", "body": queue.pop(0), "more_body": True}
        if stall:
            await asyncio.Event().wait()  # a client that sends no more
        return {"type": "http.request", "body": b"", "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request(
        {"type": "http", "method": "POST", "path": "/admin/keys", "headers": raw}, receive
    )


FORM = {"content-type": "application/x-www-form-urlencoded"}


async def test_a_form_reads_as_its_fields() -> None:
    got = await read_form(request([b"name=a%20b&csrf=", b"x&models="], FORM), 1.0)
    assert got == {"name": "a b", "csrf": "x", "models": ""}


async def test_a_form_that_stops_arriving_is_refused_in_time() -> None:
    slow = request([b"name=a"], {**FORM, "content-length": "65536"}, stall=True)
    with pytest.raises(Refusal) as refused:
        await read_form(slow, 0.2)
    assert refused.value.status == 408


async def test_a_large_form_or_another_kind_is_refused() -> None:
    with pytest.raises(Refusal) as big:
        await read_form(request([b"x" * 70_000], FORM), 1.0)
    assert big.value.status == 413
    with pytest.raises(Refusal) as said_large:
        await read_form(request([], {**FORM, "content-length": "70000"}), 1.0)
    assert said_large.value.status == 413
    with pytest.raises(Refusal) as kind:
        await read_form(request([b"{}"], {"content-type": "application/json"}), 1.0)
    assert kind.value.status == 415
