"""``/metrics`` of a large fleet goes out in pieces: encoded (and compressed) a few
megabytes at a time in a worker thread, never copied whole on the event loop, and read
back it is the same exposition as the one string ``Scrape.text`` makes."""

from __future__ import annotations

import zlib

import httpx
import pytest

from llmgw.server import scrape
from llmgw.server.app import ControlPlane
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.states import NodeState
from tests.support.nodefacts import card, facts, live


def test_pieces_read_back_as_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrape, "PIECE", 10)
    words = [f"line {i} {'x' * (i % 7)}\n" for i in range(50)]
    plain = scrape.encoded(words, gzip=False)
    assert len(plain) > 5  # cut where the pieces passed 10 characters, not once
    assert all(plain)
    assert b"".join(plain).decode() == "".join(words)
    packed = scrape.encoded(words, gzip=True)
    assert zlib.decompress(b"".join(packed), 31).decode() == "".join(words)
    assert scrape.encoded(["one\n"], gzip=False) == [b"one\n"]


def _fleet(cp: ControlPlane, nodes: int) -> None:
    for i in range(nodes):
        view = NodeView(id=f"gpu{i:02}", cert_serial=1, state=NodeState.READY)
        cards = [card(n, uuid=f"GPU-{i}-{n}", utilization=10 + n) for n in range(4)]
        view.facts = facts(gpus=cards)
        view.live = live(gpus=cards, cpu_percent=12.5)
        view.last_seen = view.live.read_at["gpus"]
        cp.registry.nodes[view.id] = view


@pytest.mark.parametrize("gzip", [False, True])
async def test_a_fleet_in_many_pieces(
    plane: tuple[ControlPlane, httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
    gzip: bool,
) -> None:
    cp, client = plane
    # Small pieces and snapshot batches: every node is read across several turns of
    # the event loop, and the answer is streamed in many pieces.
    monkeypatch.setattr(scrape, "PIECE", 2000)
    monkeypatch.setattr(scrape, "SNAPSHOT_BATCH", 3)
    _fleet(cp, 11)
    pieces = await cp.scrape.body(gzip)
    # zlib keeps what it has not yet compressed: only the plain text's count is known.
    assert len(pieces) > (1 if gzip else 3)
    headers = {"accept-encoding": "gzip"} if gzip else {"accept-encoding": "identity"}
    answer = await client.get("/metrics", headers=headers)
    assert answer.status_code == 200
    assert answer.headers.get("content-encoding") == ("gzip" if gzip else None)
    # Made whole before it goes: sent with its length, not chunked.
    assert int(answer.headers["content-length"]) == sum(len(p) for p in pieces)
    assert "transfer-encoding" not in answer.headers
    text = answer.text  # httpx undoes the gzip
    assert text == await cp.scrape.text()
    for i in range(11):
        assert f'llmgw_node_up{{node="gpu{i:02}"}} 1' in text
        assert f'uuid="GPU-{i}-3"' in text
    assert text.count("# TYPE llmgw_gpu_busy_ratio gauge") == 1
