"""A standby's follower against a leader that answers from a script (the link's JSON,
no sockets): it refuses a leader whose term is below its store's, takes a snapshot when
the leader or term changes, and applies what comes after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.server.ha import sqlitesync
from llmgw.server.ha.follower import TERM_SETTING, Follower
from llmgw.server.ha.peerlink import PeerError
from llmgw.server.store import ApiKeyRecord, Audit
from llmgw.server.store.sqlite import SQLiteStore


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "leader.db")
    await store.open()
    await store.put_setting(TERM_SETTING, "2")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def standby(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "standby.db")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


class Link:
    """The leader's side of the link, read straight from its store."""

    def __init__(self, store: SQLiteStore, term: int, name: str = "cp-a") -> None:
        self.store = store
        self.term = term
        self.name = name
        self.asked: list[str] = []

    async def json(self, method: str, address: str, path: str, *args: Any, **kw: Any) -> Any:
        self.asked.append(path)
        if path == "/peer/state":
            return {"name": self.name, "role": "leader", "term": self.term, "leader": None}
        if path == "/peer/changes":
            after = int(kw["params"]["after"])
            changes = await sqlitesync.changes_after(self.store, after)
            return {
                "term": self.term,
                "leader": self.name,
                "seq": await sqlitesync.latest_seq(self.store),
                "changes": [c.as_json() for c in changes],
            }
        raise PeerError(f"{address}: no {path}")

    async def snapshot(self, address: str, dest: Path) -> tuple[int, int]:
        self.asked.append("/peer/snapshot")
        return await sqlitesync.snapshot(self.store, dest), self.term


def follower(store: SQLiteStore, link: Link, applied: list[set[str]]) -> Follower:
    async def note(tables: set[str]) -> None:
        applied.append(tables)

    return Follower(store, link, "127.0.0.1:1", note, lambda nodes: None, lambda peer: None)  # type: ignore[arg-type]


async def test_a_standby_ahead_of_its_leader_refuses_to_follow_it(
    leader: SQLiteStore, standby: SQLiteStore
) -> None:
    await standby.put_setting(TERM_SETTING, "3")
    await standby.put_setting("mine", "kept")
    applied: list[set[str]] = []
    f = follower(standby, Link(leader, term=2), applied)
    with pytest.raises(PeerError, match="refusing to follow cp-a.*term 2.*holds term 3"):
        await f._follow_store(asyncio.Event())
    # Nothing taken from it: no snapshot asked for, the store as it was.
    assert applied == [] and await standby.get_setting("mine") == "kept"


async def test_a_standby_takes_a_snapshot_then_each_change(
    leader: SQLiteStore, standby: SQLiteStore
) -> None:
    await leader.add_api_key(
        ApiKeyRecord("k1", "one", "h1", created_at=1.0), Audit("a", "key.add", "k1")
    )
    link = Link(leader, term=2)
    applied: list[set[str]] = []
    f = follower(standby, link, applied)
    stop = asyncio.Event()
    task = asyncio.create_task(f._follow_store(stop))
    try:
        await _until(lambda: f.seq > 0 and f.caught_up is not None)
        assert [k.id for k in await standby.list_api_keys()] == ["k1"]
        assert link.asked[:2] == ["/peer/state", "/peer/snapshot"]
        await leader.revoke_api_key("k1", 5.0, Audit("a", "key.revoke", "k1"))
        await _until(
            lambda: {"api_keys"} <= set().union(*applied[1:]) if len(applied) > 1 else False
        )
        (k1,) = await standby.list_api_keys()
        assert k1.revoked_at == 5.0
        assert await standby.get_setting(TERM_SETTING) == "2"
        assert (f.leader_name, f.term) == ("cp-a", 2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def _until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)
