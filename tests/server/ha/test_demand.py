"""A standby's on-demand requests passed to the leader: a start sent at once, keep-ups
gathered, and nothing lost to a leader that does not answer for a moment."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmgw.server.ha.demand import PATH, DemandRelay
from llmgw.server.ha.peerlink import PeerError, read_demand


class Link:
    """The control planes' link as the relay uses it: each call kept; ``down`` fails."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, Any]] = []
        self.down = False
        self.called = asyncio.Event()

    async def json(self, method: str, address: str, path: str, body: Any = None, **kw: Any) -> Any:
        self.calls.append((method, address, path, body))
        self.called.set()
        if self.down:
            raise PeerError(f"{address}: cannot ask it (in this test)")
        return {"models": len(body["models"])}


def relay(link: Link, leader: str = "10.0.0.1:8444") -> DemandRelay:
    return DemandRelay(link, lambda: leader)  # type: ignore[arg-type]


async def test_a_start_is_sent_at_once_and_keep_ups_are_gathered() -> None:
    link = Link()
    r = relay(link)
    r.ask("warm", False)
    r.ask("warm", False)
    stop = asyncio.Event()
    loop = asyncio.create_task(r.run(stop))
    try:
        r.ask("lazy", True)
        async with asyncio.timeout(1):  # well before the round of keep-ups (2 s)
            await link.called.wait()
        assert link.calls == [
            ("POST", "10.0.0.1:8444", PATH, {"models": {"warm": False, "lazy": True}})
        ]
        assert r.pending == {} and r.sent == 1
    finally:
        stop.set()
        await loop


async def test_a_start_wins_over_a_keep_up_of_the_same_model() -> None:
    link = Link()
    r = relay(link)
    r.ask("lazy", True)
    r.ask("lazy", False)
    assert await r.send()
    assert link.calls[0][3] == {"models": {"lazy": True}}


async def test_what_cannot_be_sent_is_kept_for_the_next_round() -> None:
    link = Link()
    link.down = True
    r = relay(link)
    r.ask("lazy", True)
    assert not await r.send()
    assert r.pending == {"lazy": True}
    link.down = False
    assert await r.send()
    assert link.calls[-1][3] == {"models": {"lazy": True}} and r.pending == {}

    # No leader known yet: nothing is sent, nothing is lost.
    lost = relay(link, leader="")
    lost.ask("lazy", True)
    assert not await lost.send() and lost.pending == {"lazy": True}


def test_the_link_reads_only_a_map_of_models_to_start() -> None:
    assert read_demand({"models": {"lazy": True, "warm": False}}) == {
        "lazy": True,
        "warm": False,
    }
    for bad in (None, [], {"models": ["lazy"]}, {"models": {"lazy": "yes"}}, {}):
        with pytest.raises(ValueError, match="models"):
            read_demand(bad)
