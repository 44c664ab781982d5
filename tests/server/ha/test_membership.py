"""Removing a control plane by name: refused for the one answering while it leads and
for a name never joined; audited under the caller; the leadership reads the list again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from llmgw.server.ha.joining import Admission
from llmgw.server.ha.leadership import Leadership
from llmgw.server.ha.membership import Membership
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import Audit, ServerRecord, SQLiteStore

ADMIN = Principal("admin@10.0.0.5", "admin", "token")


@dataclass
class Plane:
    """What Membership reads of the leadership: its name, its store, and the reload."""

    name: str
    store: SQLiteStore
    reloads: int = 0

    async def reload_servers(self) -> None:
        self.reloads += 1


async def no_admission() -> Admission:
    raise AssertionError("removing asks nothing of a joiner's admission")


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    for name in ("cp-a", "cp-b"):
        record = ServerRecord(name, "1", f"{name}:8080", f"{name}:8443", f"{name}:8444", 1.0)
        await store.put_server(record, Audit("test", "server.join", name))
    try:
        yield Plane("cp-a", store)
    finally:
        await store.close()


def members(plane: Plane) -> Membership:
    return Membership(cast(Leadership, plane), no_admission)


async def test_a_standby_is_removed_once_audited_and_the_list_read_again(plane: Plane) -> None:
    assert await members(plane).remove("cp-b", ADMIN) is True
    (removed,) = [s for s in await plane.store.list_servers() if s.name == "cp-b"]
    assert removed.removed_at is not None
    assert plane.reloads == 1
    (entry, *_) = await plane.store.audit_log()
    assert (entry["actor"], entry["action"], entry["target"]) == (
        "admin@10.0.0.5",
        "server.remove",
        "cp-b",
    )
    # Removed before: nothing changes, and it says so.
    assert await members(plane).remove("cp-b", ADMIN) is False


async def test_the_one_answering_and_a_stranger_are_refused_and_nothing_changes(
    plane: Plane,
) -> None:
    with pytest.raises(Refusal) as answering:
        await members(plane).remove("cp-a", ADMIN)
    assert answering.value.status == 409 and "promote another first" in answering.value.message
    with pytest.raises(Refusal) as stranger:
        await members(plane).remove("cp-z", ADMIN)
    assert stranger.value.status == 404 and "cp-z" in stranger.value.message
    assert all(s.removed_at is None for s in await plane.store.list_servers())
    assert plane.reloads == 0
