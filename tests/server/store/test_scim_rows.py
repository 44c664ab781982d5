"""SCIM's users and groups in every store backend: kept whole (a group's members in
their order, a user's externalId and when it was hidden), replaced, removed, audited."""

from __future__ import annotations

from dataclasses import replace

from llmgw.server.scim.records import ScimGroup, ScimUser
from llmgw.server.store import Audit, Store
from tests.server.store.conftest import audits

NOW = 1_790_000_000.25


async def test_scim_users_and_groups_come_back_as_they_were_written(store: Store) -> None:
    rows = store.directory
    assert await rows.all(ScimUser) == [] and await rows.all(ScimGroup) == []
    alice = ScimUser("p1", "00u1", None, NOW, NOW)
    bob = ScimUser("p2", None, NOW + 3, NOW + 1, NOW + 3)
    eng = ScimGroup("g1", "Engineers", "grp-1", ("p2", "p1"), NOW, NOW + 0.5)
    await rows.change([alice, bob, eng], [], Audit("scim", "scim.user.create", "alice"))
    assert await rows.all(ScimUser) == [alice, bob]
    assert await rows.all(ScimGroup) == [eng]

    emptied = replace(eng, members=(), external_id=None, updated_at=NOW + 9)
    await rows.put(emptied, Audit("scim", "scim.group.update", "Engineers", "0 members"))
    assert await rows.all(ScimGroup) == [emptied]
    assert await rows.delete(emptied, Audit("scim", "scim.group.remove", "Engineers"))
    assert not await rows.delete(emptied, Audit("scim", "scim.group.remove", "Engineers"))
    assert await rows.all(ScimGroup) == []
    assert [a[1] for a in await audits(store)][:3] == [
        "scim.group.remove",
        "scim.group.update",
        "scim.user.create",
    ]
