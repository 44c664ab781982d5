"""What every store backend promises about whole changes and its own life: a change and
its audit entry are written together or not at all, a batch is one transaction, changes
running at once do not commit each other's halves, and a store closed and opened again
holds everything it held.

A change is made to fail half-way by an audit entry or a row the schema refuses (a
missing required value): the change itself is written first, then that part fails.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from llmgw.server.store import ApiKeyRecord, Audit, JoinTokenRecord, Store, StoreError
from tests.server.store.conftest import Backend, audits

# A value every backend's schema refuses where a required one goes (NOT NULL).
MISSING: Any = None
# An audit entry that cannot be written: the change it goes with must not be either.
BAD_AUDIT = Audit(MISSING, "x.fail", "x")


async def test_a_model_whose_audit_entry_fails_is_not_written(
    store: Store, backend: Backend
) -> None:
    with pytest.raises(backend.conflict):
        await store.put_model("m", {"source": "a"}, BAD_AUDIT)
    assert await store.list_models() == []
    assert await store.audit_log() == []


async def test_a_failed_replace_or_delete_keeps_the_model(store: Store, backend: Backend) -> None:
    await store.put_model("m", {"source": "v1"}, Audit("admin", "model.put", "m"))
    (before,) = await store.list_models()
    with pytest.raises(backend.conflict):
        await store.put_model("m", {"source": "v2"}, BAD_AUDIT)
    with pytest.raises(backend.conflict):
        await store.delete_model("m", BAD_AUDIT)
    assert await store.list_models() == [before]
    assert await audits(store) == [("admin", "model.put", "m", "")]


async def test_a_key_whose_audit_entry_fails_is_not_added_nor_revoked(
    store: Store, backend: Backend
) -> None:
    with pytest.raises(backend.conflict):
        await store.add_api_key(ApiKeyRecord("k1", "a", "sha256:1", created_at=1.0), BAD_AUDIT)
    assert await store.list_api_keys() == []
    kept = ApiKeyRecord("k2", "b", "sha256:2", created_at=2.0)
    await store.add_api_key(kept, Audit("admin", "key.add", "k2"))
    with pytest.raises(backend.conflict):
        await store.revoke_api_key("k2", 9.0, BAD_AUDIT)
    assert await store.list_api_keys() == [kept]
    assert await audits(store) == [("admin", "key.add", "k2", "")]


async def test_a_failed_admin_token_rotation_keeps_the_old_tokens(
    store: Store, backend: Backend
) -> None:
    await store.add_admin_token("initial", "hash-1")
    # The old tokens are removed first, then the new one fails: nothing of it is kept.
    with pytest.raises(backend.conflict):
        await store.replace_admin_tokens("r1", MISSING, Audit("admin", "x", "y"))
    with pytest.raises(backend.conflict):
        await store.replace_admin_tokens("r1", "hash-2", BAD_AUDIT)
    assert await store.admin_token_hashes() == ["hash-1"]
    assert await store.audit_log() == []


async def test_node_scheduling_whose_audit_entry_fails_is_not_written(
    store: Store, backend: Backend
) -> None:
    await store.enroll_node("n1", "1", 1.0)
    with pytest.raises(backend.conflict):
        await store.set_node_scheduling("n1", True, True, {"zone": "a"}, BAD_AUDIT)
    node = await store.get_node("n1")
    assert node is not None and (node.cordoned, node.draining, node.labels) == (False, False, {})
    assert await store.audit_log() == []


async def test_a_usage_batch_is_added_whole_or_not_at_all(store: Store, backend: Backend) -> None:
    await store.add_usage([("2025-01-01", "k1", "m", "r1", 1, 10, 10)])
    with pytest.raises(backend.conflict):
        await store.add_usage(
            [
                ("2025-01-01", "k1", "m", "r1", 5, 50, 50),  # would add to the row above
                ("2025-01-02", "k1", "m", "r1", 1, 1, 1),  # would be a new row
                ("2025-01-03", "k1", "m", "r1", MISSING, 1, 1),  # refused: no requests
            ]
        )
    rows = await store.usage("2025-01-01")
    assert [(r["day"], r["requests"], r["prompt_tokens"]) for r in rows] == [("2025-01-01", 1, 10)]


async def test_node_batches_are_written_whole_or_not_at_all(store: Store, backend: Backend) -> None:
    await store.enroll_node("n1", "1", 1.0)
    await store.enroll_node("n2", "2", 1.0)
    with pytest.raises(backend.conflict):
        await store.register_nodes(
            [("n1", "10.0.0.1", "0.1", {"a": 1}, 2.0), ("n2", "10.0.0.2", MISSING, {}, 2.0)]
        )
    with pytest.raises(backend.conflict):
        await store.set_node_states([("n1", "Ready", "", 3.0), ("n2", MISSING, "", 3.0)])
    for node in await store.list_nodes():
        assert (node.state, node.address, node.facts, node.last_seen) == (
            "NotReady",
            None,
            None,
            None,
        )


async def test_after_a_failed_change_the_next_one_commits_only_itself(
    store: Store, backend: Backend
) -> None:
    with pytest.raises(backend.conflict):
        await store.put_model("half", {"source": "x"}, BAD_AUDIT)
    await store.put_setting("after", "1")
    await store.audit("admin", "after", "x")
    assert await store.list_models() == []
    assert await store.get_setting("after") == "1"
    assert await audits(store) == [("admin", "after", "x", "")]


async def test_changes_at_once_do_not_commit_each_others_halves(
    store: Store, backend: Backend
) -> None:
    # The admin API, the node registry and the usage writer change the store at once.
    results = await asyncio.gather(
        store.put_model("half", {"source": "x"}, BAD_AUDIT),
        store.put_setting("s", "1"),
        store.add_usage([("2025-01-01", "k", "m", "r", 1, 1, 1)]),
        store.put_model("whole", {"source": "y"}, Audit("admin", "model.put", "whole")),
        return_exceptions=True,
    )
    assert isinstance(results[0], backend.conflict)
    assert results[1:] == [None, None, None]
    assert [m.name for m in await store.list_models()] == ["whole"]
    assert await audits(store) == [("admin", "model.put", "whole", "")]
    assert await store.get_setting("s") == "1"
    assert len(await store.usage("2025-01-01")) == 1


async def test_a_change_cancelled_half_way_is_whole_or_absent(store: Store) -> None:
    # A caller may be cancelled (shutdown, a timeout) while its change is under way.
    task = asyncio.create_task(
        store.put_model("m", {"source": "x"}, Audit("admin", "model.put", "m"))
    )
    await asyncio.sleep(0)  # let it start its first statement, then cancel it there
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.put_setting("next", "1")  # a later change must not commit a leftover half
    models = [m.name for m in await store.list_models()]
    assert models in ([], ["m"])
    assert await audits(store) == ([("admin", "model.put", "m", "")] if models else [])
    assert await store.get_setting("next") == "1"


# -------------------------------------------------------------- open, close, reopen


async def test_a_fresh_store_takes_writes_and_watch_ends_on_stop(store: Store) -> None:
    assert store.writable().ok and store.writable().problem == ""
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(store.watch(stop), timeout=5)  # returns, not a hang
    assert store.writable().ok


async def test_a_store_opened_again_holds_everything(backend: Backend, tmp_path: Path) -> None:
    store = await backend.open(tmp_path)
    token = JoinTokenRecord("t1", "sealed:x", 1.0, 100.0, "admin")
    api_key = ApiKeyRecord("k1", "a", "sha256:1", models=("m",), rpm=5, created_at=3.0)
    try:
        await store.put_setting("s", "v")
        await store.add_admin_token("a1", "hash-1")
        await store.add_join_token(token)
        await store.use_join_token("t1", "n1", 2.0)
        await store.enroll_node("n1", "serial", 1.0)
        await store.register_node("n1", "10.0.0.1", "0.1", {"cpu_count": 4}, 2.0)
        await store.set_node_scheduling("n1", True, False, {"z": "a"}, Audit("a", "cordon", "n1"))
        await store.put_model("m", {"source": "x", "n": [1, 2]}, Audit("a", "model.put", "m"))
        await store.add_api_key(api_key, Audit("a", "key.add", "k1"))
        await store.revoke_api_key("k1", 4.0, Audit("a", "key.revoke", "k1"))
        await store.add_usage([("2025-01-01", "k1", "m", "r1", 1, 2, 3)])
        await store.audit("a", "by.hand", "x")
        nodes, models, keys = (
            await store.list_nodes(),
            await store.list_models(),
            await store.list_api_keys(),
        )
        usage, log = await store.usage("2025-01-01"), await store.audit_log()
    finally:
        await store.close()

    again = await backend.open(tmp_path)
    try:
        assert await again.get_setting("s") == "v"
        assert await again.admin_token_hashes() == ["hash-1"]
        assert await again.get_join_token("t1") == JoinTokenRecord(
            "t1", "sealed:x", 1.0, 100.0, "admin", used_at=2.0, used_by="n1"
        )
        assert await again.use_join_token("t1", "n2", 5.0) is False  # still used
        assert await again.list_nodes() == nodes
        assert nodes[0].cordoned and nodes[0].facts == {"cpu_count": 4}
        assert await again.list_models() == models
        assert await again.list_api_keys() == keys and keys[0].revoked_at == 4.0
        assert await again.usage("2025-01-01") == usage
        assert await again.audit_log() == log and len(log) == 5
        assert again.writable().ok
    finally:
        await again.close()


async def test_a_closed_store_refuses_and_closes_twice(backend: Backend, tmp_path: Path) -> None:
    store = await backend.open(tmp_path)
    await store.put_setting("s", "v")
    await store.close()
    await store.close()  # closing again is harmless (shutdown paths may do it twice)
    with pytest.raises(StoreError):
        await store.get_setting("s")
    with pytest.raises(StoreError):
        await store.put_setting("s", "w")
    again = await backend.open(tmp_path)
    try:
        assert await again.get_setting("s") == "v"
    finally:
        await again.close()
