"""Signing out on every control plane: the leader keeps a sign-out in the store, a
standby sends its own to the leader, every control plane refuses what the store holds,
and a sign-out holds where it was made even when the others cannot be told."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.config import ServerConfig, StoreConfig
from llmgw.server.sessions import Revocations, Sessions, SignOut
from llmgw.server.store import Store, open_store

SECRET = b"k" * 32


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await open_store(ServerConfig(store=StoreConfig("sqlite", "store.db")), tmp_path)
    try:
        yield opened
    finally:
        await opened.close()


def plane(store: Store, leading: bool, sent: list[SignOut], reachable: bool = True) -> Revocations:
    """One control plane's revocations over ``store``: ``sent`` holds what it told its
    leader (refused with ConnectionError when ``reachable`` is False)."""

    async def to_leader(signed_out: SignOut) -> None:
        if not reachable:
            raise ConnectionError("the leader at cp-a:8444 did not take it")
        sent.append(signed_out)

    return Revocations(Sessions(SECRET, lambda: ["hash-a"]), store, lambda: leading, to_leader)


async def test_a_leaders_sign_out_is_refused_by_every_control_plane_that_reads_the_store(
    store: Store,
) -> None:
    leader = plane(store, True, [])
    standby = plane(store, False, [])  # reads the same rows, as a follower's copy would
    cookie = leader.sessions.open("admin@10.0.0.7", "admin", "hash-a")
    session = leader.sessions.read(cookie)
    assert session is not None and standby.sessions.read(cookie) is not None
    await leader.end(session, "admin@10.0.0.7")
    assert leader.sessions.read(cookie) is None
    assert await store.revoked_sessions(time.time()) == {session.sid: session.expires}
    assert standby.sessions.read(cookie) is not None  # not until its store is read
    await standby.load()
    assert standby.sessions.read(cookie) is None
    # Another session of the same token is untouched.
    other = leader.sessions.open("admin@10.0.0.8", "admin", "hash-a")
    assert leader.sessions.read(other) is not None and standby.sessions.read(other) is not None
    log = await store.audit_log()
    assert (log[0]["actor"], log[0]["action"]) == ("admin@10.0.0.7", "admin.sign_out")


async def test_a_standbys_sign_out_goes_to_the_leader_which_keeps_it(store: Store) -> None:
    sent: list[SignOut] = []
    standby = plane(store, False, sent)
    leader = plane(store, True, [])
    cookie = standby.sessions.open("admin@10.0.0.7", "admin", "hash-a")
    session = standby.sessions.read(cookie)
    assert session is not None
    await standby.end(session, "admin@10.0.0.7")
    # Refused here at once; the store is the leader's to write.
    assert standby.sessions.read(cookie) is None
    assert sent == [SignOut(session.sid, session.expires, "admin@10.0.0.7")]
    assert await store.revoked_sessions(time.time()) == {}
    await leader.record(sent[0])  # /peer/signout on the leader
    assert leader.sessions.read(cookie) is None
    assert await store.revoked_sessions(time.time()) == {session.sid: session.expires}


async def test_a_sign_out_holds_where_it_was_made_when_the_leader_cannot_be_told(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    standby = plane(store, False, [], reachable=False)
    cookie = standby.sessions.open("admin@10.0.0.7", "admin", "hash-a")
    session = standby.sessions.read(cookie)
    assert session is not None
    await standby.end(session, "admin@10.0.0.7")
    assert standby.sessions.read(cookie) is None
    assert "other control planes were not told" in caplog.text
    assert "cp-a:8444" in caplog.text
    assert cookie not in caplog.text  # the session's cookie is never logged


async def test_a_control_plane_started_later_refuses_what_was_signed_out_before(
    store: Store,
) -> None:
    leader = plane(store, True, [])
    cookie = leader.sessions.open("admin@10.0.0.7", "admin", "hash-a")
    session = leader.sessions.read(cookie)
    assert session is not None
    await leader.end(session, "admin@10.0.0.7")
    restarted = plane(store, True, [])
    assert restarted.sessions.read(cookie) is not None
    await restarted.load()
    assert restarted.sessions.read(cookie) is None
