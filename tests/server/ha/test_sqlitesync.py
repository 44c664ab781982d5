"""Following a leader's SQLite store: what its triggers capture, shipping it to a standby
(through JSON, as the link carries it), snapshots, pruning, and the changes refused.

A leader and a standby are real stores in tmp_path. After shipping, the standby must
read through the Store interface exactly what the leader reads, and hold every row with
the same values of the same types (a REAL's every digit).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.server.ha import sqlitesync
from llmgw.server.ha.sqlitesync import (
    REPLICATED,
    Change,
    ChangeRefused,
    TooFarBehind,
    applied,
    apply,
    changes_after,
    latest_seq,
    prune,
    restore,
    snapshot,
)
from llmgw.server.people.records import Limits, Membership, Org, Person, PersonToken, Project, Team
from llmgw.server.scim.records import ScimGroup, ScimUser
from llmgw.server.store import ApiKeyRecord, Audit, JoinTokenRecord, ServerRecord, StoreTooNew
from llmgw.server.store.finetunes import FinetuneRow
from llmgw.server.store.jobrows import JobRecord
from llmgw.server.store.sqlite import SQLiteStore

NOW = time.time()  # every digit of it must reach the standby
DAY = "2026-12-03"


async def _open(path: Path) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    return store


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = await _open(tmp_path / "leader" / "store.db")
    yield store
    await store.close()


@pytest.fixture
async def standby(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = await _open(tmp_path / "standby" / "store.db")
    yield store
    await store.close()


async def ship(leader: SQLiteStore, standby: SQLiteStore, limit: int = 1000) -> int:
    """What a standby's loop does: ask for what follows what it applied, apply it."""
    while True:
        seq, _, _ = await applied(standby)
        batch = await changes_after(leader, seq, limit)
        if not batch:
            return seq
        wire = json.loads(json.dumps([c.as_json() for c in batch]))
        await apply(standby, [Change.from_json(c) for c in wire], "cp1", 1)


async def rows(store: SQLiteStore, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    async with store.db.execute(sql, params) as cur:
        return [tuple(r) for r in await cur.fetchall()]


async def raw(store: SQLiteStore, sql: str, params: tuple[Any, ...] = ()) -> None:
    await store.db.execute(sql, params)
    await store.db.commit()


async def dump(store: SQLiteStore) -> dict[str, list[list[tuple[str, Any]]]]:
    """Every replicated row, each value with its type (1.0 is not 1)."""
    out = {}
    for table in sorted(REPLICATED):
        where = " WHERE NOT (key = 'store.checked_at' OR key LIKE 'local.%')"
        found = await rows(store, f"SELECT * FROM {table}{where if table == 'settings' else ''}")
        out[table] = sorted(([(type(v).__name__, v) for v in r] for r in found), key=repr)
    return out


async def reads(store: SQLiteStore) -> dict[str, Any]:
    """What the control plane reads through the Store interface."""
    return {
        "settings": [await store.get_setting(k) for k in ("cluster.name", "cluster.ca")],
        "admin": sorted(await store.admin_token_hashes()),
        "join": [await store.get_join_token(t) for t in ("t1", "t2")],
        "nodes": await store.list_nodes(),
        "node": await store.get_node("n1"),
        "models": await store.list_models(),
        "keys": await store.list_api_keys(),
        "usage": await store.usage(""),
        "audit": await store.audit_log(1000),
        "servers": await store.list_servers(),
        "revoked": await store.revoked_sessions(0.0),
        "orgs": await store.directory.all(Org),
        "teams": await store.directory.all(Team),
        "projects": await store.directory.all(Project),
    }


async def captured(store: SQLiteStore) -> list[tuple[str, str, dict[str, Any]]]:
    return [(c.table, c.op, c.pk) for c in await changes_after(store, 0)]


def by(actor: str, action: str, target: str) -> Audit:
    return Audit(actor, action, target, f"{action} {target}")


Write = Callable[[SQLiteStore], Awaitable[object]]
# Every Store method that writes, some more than once, in an order that makes sense.
ALICE = Person(
    "p1", "alice", "Alice", "alice@lab", "operator", True, "oidc", "iss|1", True, NOW, NOW
)
LAB = Org("o1", "lab", Limits(60, 1000, 2**40, ("qwen*",), ("jira.*",), ("pii",)), NOW)
VISION = Team("t1", "o1", "vision", Limits(tpm=500), NOW)
VISION_DEMO = Project("j1", "o1", "t1", "demo", Limits(), NOW)
ALICE_IN_VISION = Membership("p1", "team", "t1", "manager", True, NOW)
ALICE_TOKEN = PersonToken("tk1", "p1", "laptop", "sha256:tk1", NOW, NOW + 86400)
ALICE_AT_SCIM = ScimUser("p1", "00u1", None, NOW, NOW)
SERVING = JobRecord(
    "job-0123456789ab", "serve", "m", "running", {"id": "job-0123456789ab"}, NOW, NOW + 11.5
)
ENGINEERS = ScimGroup("g1", "Engineers", "grp-1", ("p1", "p2"), NOW, NOW + 0.5)

TUNING = FinetuneRow("ft-1", "tuned", "m1", "training", '{"step": 1}', NOW, NOW + 1 / 3)

WRITES: list[tuple[str, Write]] = [
    ("put_setting", lambda s: s.put_setting("cluster.name", "lab")),
    ("put_setting again", lambda s: s.put_setting("cluster.name", "prod")),
    ("put_setting 2", lambda s: s.put_setting("cluster.ca", "-----BEGIN\n\u00e9\n")),
    ("add_admin_token", lambda s: s.add_admin_token("a1", "hash-1")),
    (
        "add_join_token",
        lambda s: s.add_join_token(JoinTokenRecord("t1", "sealed:x", NOW, NOW + 3600, "admin")),
    ),
    ("add_join_token 2", lambda s: s.add_join_token(JoinTokenRecord("t2", "s:y", 1, 2.5, "a"))),
    ("use_join_token", lambda s: s.use_join_token("t1", "n1", NOW + 1 / 3)),
    ("enroll_node", lambda s: s.enroll_node("n1", "serial-1", NOW)),
    ("enroll_node 2", lambda s: s.enroll_node("n2", "serial-2", NOW + 0.1)),
    ("enroll_node again", lambda s: s.enroll_node("n2", "serial-3", NOW + 0.2)),
    (
        "register_nodes",
        lambda s: s.register_nodes(
            [
                ("n1", "10.0.0.1:9000", "1.0", {"cpus": 4, "gpus": [{"mem": 80.5}]}, NOW + 2),
                ("n2", None, "1.1", {}, NOW + 2.5),
            ]
        ),
    ),
    (
        "set_node_states",
        lambda s: s.set_node_states(
            [("n1", "NotReady", "missed", NOW + 3), ("n2", "Ready", "", None)]
        ),
    ),
    (
        "set_node_scheduling",
        lambda s: s.set_node_scheduling("n1", True, True, {"zone": "a"}, by("ops", "cordon", "n1")),
    ),
    (
        "put_model",
        lambda s: s.put_model("m1", {"source": "hf://x", "ratio": 0.1}, by("ops", "put", "m1")),
    ),
    ("put_model again", lambda s: s.put_model("m1", {"source": "hf://y"}, by("ops", "put", "m1"))),
    ("put_model 2", lambda s: s.put_model("m2", {"source": "hf://z"}, by("ops", "put", "m2"))),
    ("delete_model", lambda s: s.delete_model("m2", by("ops", "delete", "m2"))),
    ("delete_model absent", lambda s: s.delete_model("m9", by("ops", "delete", "m9"))),
    (
        "add_api_key",
        lambda s: s.add_api_key(
            ApiKeyRecord(
                "k1", "team", "sha256:k1", ("m1", "m2"), 60, None, 2**62, NOW + 86400, NOW
            ),
            by("ops", "key.add", "k1"),
        ),
    ),
    (
        "set_api_key_priority",
        lambda s: s.set_api_key_priority("k1", 3, by("ops", "key.update", "k1")),
    ),
    ("revoke_api_key", lambda s: s.revoke_api_key("k1", NOW + 5, by("ops", "key.revoke", "k1"))),
    ("add_usage", lambda s: s.add_usage([(DAY, "k1", "m1", "r1", 1, 10, 20)])),
    (
        "add_usage again",
        lambda s: s.add_usage([(DAY, "k1", "m1", "r1", 2, 5, 5), (DAY, "k1", "m1", "r2", 1, 1, 1)]),
    ),
    ("audit", lambda s: s.audit("admin", "cluster.rename", "lab", "from lab to prod")),
    (
        "put_server",
        lambda s: s.put_server(
            ServerRecord("cp1", "111", "cp1:80", "cp1:443", "cp1:444", NOW), by("a", "join", "cp1")
        ),
    ),
    (
        "put_server 2",
        lambda s: s.put_server(
            ServerRecord("cp2", "222", "cp2:80", "cp2:443", "cp2:444", NOW), by("a", "join", "cp2")
        ),
    ),
    ("remove_server", lambda s: s.remove_server("cp2", NOW + 6, by("a", "remove", "cp2"))),
    (
        "revoke_session",
        lambda s: s.revoke_session("sid-1", NOW + 43200, NOW + 7, by("a", "sign_out", "/")),
    ),
    (
        "revoke_session 2",
        lambda s: s.revoke_session("sid-2", NOW + 7.5, NOW + 7, by("a", "sign_out", "/")),
    ),
    (
        "revoke_session, dropping the ended",
        lambda s: s.revoke_session("sid-3", NOW + 43200, NOW + 8, by("a", "sign_out", "/")),
    ),
    (
        "set_node_replicas",
        lambda s: s.set_node_replicas(
            [("n1", [{"replica_id": "m.default.a1", "state": "ready", "port": 8001}])]
        ),
    ),
    ("put person", lambda s: s.directory.put(ALICE, by("a", "person.create", "alice"))),
    (
        "put org, team, project",
        lambda s: s.directory.change([LAB, VISION, VISION_DEMO], [], by("a", "org.create", "lab")),
    ),
    (
        "set_limits: a tool grant revoked from a level and its key, one closed",
        lambda s: s.set_limits(
            [
                (replace(LAB, limits=replace(LAB.limits, tools=())), by("a", "org.limits", "lab")),
                (replace(VISION, limits=Limits(tools=("wiki.*",))), by("a", "team.limits", "v")),
                (
                    ApiKeyRecord("k1", "team", "sha256:k1", ("m1",), tools=None, guard=("g",)),
                    by("a", "key.limits", "k1"),
                ),
            ]
        ),
    ),
    ("put membership", lambda s: s.directory.put(ALICE_IN_VISION, by("a", "member.set", "alice"))),
    ("put token", lambda s: s.directory.put(ALICE_TOKEN, by("alice", "token.create", "alice"))),
    (
        "deactivate, revoke, remove a membership",
        lambda s: s.directory.change(
            [replace(ALICE, active=False), replace(ALICE_TOKEN, revoked_at=NOW + 9)],
            [ALICE_IN_VISION],
            by("a", "person.update", "alice"),
        ),
    ),
    (
        "put a SCIM user and group",
        lambda s: s.directory.change([ALICE_AT_SCIM, ENGINEERS], [], by("scim", "scim", "alice")),
    ),
    (
        "change a SCIM group's members, hide the user",
        lambda s: s.directory.change(
            [replace(ENGINEERS, members=("p2",)), replace(ALICE_AT_SCIM, removed_at=NOW + 10)],
            [],
            by("scim", "scim.user.remove", "alice"),
        ),
    ),
    ("remove a SCIM group", lambda s: s.directory.delete(ENGINEERS, by("scim", "scim", "g1"))),
    ("put a serve job", lambda s: s.jobs.put(SERVING)),
    (
        "a serve job moves on",
        lambda s: s.jobs.put(replace(SERVING, state="failed", updated_at=NOW + 12)),
    ),
    ("prune the serve jobs", lambda s: s.jobs.prune(NOW + 8 * 86400)),
    ("put a fine-tune", lambda s: s.finetunes.put(TUNING, by("ops", "finetune.create", "ft-1"))),
    ("fine-tune progress", lambda s: s.finetunes.put_many([replace(TUNING, doc='{"step": 3}')])),
    (
        "a fine-tune's adapter",
        lambda s: s.finetunes.finish(
            replace(TUNING, state="succeeded"), b"\x00\xffgguf" * 5, 8, by("ops", "ok", "ft-1")
        ),
    ),
]


# ---------------------------------------------------------------------- shipping


async def test_every_write_shipped_reads_the_same_on_the_standby(
    leader: SQLiteStore, standby: SQLiteStore
) -> None:
    for name, write in WRITES:
        await write(leader)
        seq = await ship(leader, standby, limit=2)  # in small batches too
        assert seq == await latest_seq(leader), name
        assert await reads(standby) == await reads(leader), name
        assert await dump(standby) == await dump(leader), name
    assert (await reads(standby))["keys"][0].expires_at == NOW + 86400  # every digit
    assert await applied(standby) == (await latest_seq(leader), "cp1", 1)


async def test_each_capture_holds_every_column_of_its_table(leader: SQLiteStore) -> None:
    for _, write in WRITES:
        await write(leader)
    upserts = {c.table: c for c in await changes_after(leader, 0) if c.op == "upsert"}
    assert set(upserts) == REPLICATED
    for table, change in upserts.items():
        columns = await rows(leader, "SELECT name FROM pragma_table_info(?)", (table,))
        assert change.row is not None and set(change.row) == {c for (c,) in columns}, table


async def test_every_table_but_the_bookkeeping_is_replicated(leader: SQLiteStore) -> None:
    # A table added by a later migration without its triggers would silently not ship.
    tables = {t for (t,) in await rows(leader, "SELECT name FROM sqlite_master WHERE type='table'")}
    local = {"changes", "replica_state", "schema_migrations", "sqlite_sequence"}
    assert tables - local == REPLICATED
    triggers = await rows(
        leader, "SELECT tbl_name, count(*) FROM sqlite_master WHERE type='trigger' GROUP BY 1"
    )
    assert dict(triggers) == {t: 3 for t in REPLICATED}  # insert, update, delete


async def test_numbers_and_nulls_arrive_exactly(leader: SQLiteStore, standby: SQLiteStore) -> None:
    # json_object alone writes 15 digits: a timestamp would lose its last ones. (SQLite
    # 3.40's own printf misses the 17th digit of some doubles past 1e100: none here.)
    reals = [NOW, 0.1, 1 / 3, 5e-324, -2.5e-310, 6.02214076e23, 2.0**60, math.inf, -math.inf]
    ints = [0, -(2**63), 2**63 - 1, None]
    for i, real in enumerate(reals):
        await raw(
            leader,
            "INSERT INTO api_keys (id, name, key_hash, rpm, tpm, expires_at, created_at) "
            "VALUES (?, 'x', ?, ?, 1.5, ?, ?)",
            (f"k{i}", f"h{i}", ints[i % len(ints)], real, float(i)),
        )
    await ship(leader, standby)
    assert await dump(standby) == await dump(leader)
    got = await rows(standby, "SELECT expires_at, typeof(created_at), tpm FROM api_keys")
    assert [r[0] for r in got] == reals
    assert {(r[1], r[2]) for r in got} == {("real", 1.5)}


async def test_audit_entries_keep_the_leaders_ids(
    leader: SQLiteStore, standby: SQLiteStore
) -> None:
    for i in range(4):
        await leader.audit("a", "x", str(i))
    await raw(leader, "DELETE FROM audit WHERE id IN (1, 3)")  # gaps in the ids
    await ship(leader, standby)
    assert [a["id"] for a in await standby.audit_log()] == [4, 2]
    # Promoted, the standby numbers its own entries after the leader's.
    await standby.audit("b", "y", "z")
    assert (await standby.audit_log())[0]["id"] == 5


async def test_a_key_moved_by_an_update_is_a_delete_and_an_upsert(
    leader: SQLiteStore, standby: SQLiteStore
) -> None:
    await leader.put_model("old", {"source": "a"}, by("a", "put", "old"))
    await leader.add_usage([(DAY, "k", "m", "r1", 1, 2, 3)])
    await ship(leader, standby)
    start = await latest_seq(leader)
    await raw(leader, "UPDATE models SET name = 'new' WHERE name = 'old'")
    await raw(leader, "UPDATE usage SET replica = 'r2'")
    moved = [(c.table, c.op, c.pk) for c in await changes_after(leader, start)]
    assert moved == [
        ("models", "delete", {"name": "old"}),
        ("models", "upsert", {"name": "new"}),
        ("usage", "delete", {"day": DAY, "key_id": "k", "model": "m", "replica": "r1"}),
        ("usage", "upsert", {"day": DAY, "key_id": "k", "model": "m", "replica": "r2"}),
    ]
    await ship(leader, standby)
    assert [m.name for m in await standby.list_models()] == ["new"]
    assert await reads(standby) == await reads(leader)


async def test_the_stores_own_settings_are_never_captured(leader: SQLiteStore) -> None:
    # open() wrote store.checked_at already; the touch rewrites it every few seconds.
    assert await leader.get_setting("store.checked_at") is not None
    await leader.put_setting("store.checked_at", "1.0")
    await leader.check_writable()
    await leader.put_setting("local.role", "standby")
    await raw(leader, "DELETE FROM settings WHERE key = 'local.role'")
    await leader.put_setting("cluster.name", "lab")
    await raw(leader, "UPDATE settings SET key = 'local.name' WHERE key = 'cluster.name'")
    assert await captured(leader) == [
        ("settings", "upsert", {"key": "cluster.name"}),
        ("settings", "delete", {"key": "cluster.name"}),  # gone from what is replicated
    ]


async def test_a_batch_delivered_again_changes_nothing(
    leader: SQLiteStore, standby: SQLiteStore
) -> None:
    for _, write in WRITES[:8]:
        await write(leader)
    batch = await changes_after(leader, 0)
    done = await apply(standby, batch, "cp1", 1)
    before = (await dump(standby), await latest_seq(standby))
    assert await apply(standby, batch, "cp1", 1) == done
    assert await apply(standby, batch[:3], "cp1", 1) == done
    assert (await dump(standby), await latest_seq(standby)) == before
    assert await dump(standby) == await dump(leader)


# ------------------------------------------------------------- snapshot, restore


async def test_a_snapshot_restored_then_followed_converges(
    tmp_path: Path, leader: SQLiteStore, standby: SQLiteStore
) -> None:
    for _, write in WRITES[:14]:
        await write(leader)
    await leader.put_setting("local.role", "leader")
    await standby.put_setting("local.role", "standby")
    await standby.put_model("stale", {"source": "s"}, by("a", "put", "stale"))
    await sqlitesync.mark(standby, 7, "cp0", 3)

    seq = await snapshot(leader, tmp_path / "snap.db")
    assert seq == await latest_seq(leader) > 0
    copy = await _open(tmp_path / "snap.db")
    try:
        assert await latest_seq(copy) == seq
        assert await rows(copy, "SELECT count(*) FROM changes") == [(0,)]
        assert await copy.get_setting("local.role") is None  # the leader's own
    finally:
        await copy.close()
    assert not (tmp_path / "snap.db.part").exists()

    for _, write in WRITES[14:]:  # the leader goes on meanwhile
        await write(leader)
    await restore(standby, tmp_path / "snap.db")
    assert await applied(standby) == (seq, None, None)
    assert await standby.get_setting("local.role") == "standby"  # its own, kept
    assert [m.name for m in await standby.list_models()] == ["m1"]

    assert await ship(leader, standby) == await latest_seq(leader)
    assert await reads(standby) == await reads(leader)
    assert await dump(standby) == await dump(leader)


async def test_a_snapshot_from_a_newer_llmgw_is_refused(
    tmp_path: Path, leader: SQLiteStore, standby: SQLiteStore
) -> None:
    await leader.put_setting("cluster.name", "lab")
    await snapshot(leader, tmp_path / "snap.db")
    with sqlite3.connect(tmp_path / "snap.db") as db:
        db.execute("INSERT INTO schema_migrations VALUES (9999, 1.0)")
    db.close()
    await standby.put_setting("cluster.name", "mine")
    with pytest.raises(StoreTooNew):
        await restore(standby, tmp_path / "snap.db")
    assert await standby.get_setting("cluster.name") == "mine"


# ----------------------------------------------------------------------- pruning


async def test_pruned_changes_ask_for_a_snapshot(leader: SQLiteStore) -> None:
    for i in range(6):
        await leader.put_setting(f"s{i}", str(i))
    latest = await latest_seq(leader)
    assert await prune(leader, keep_seconds=600, keep_rows=0) == 0  # all young: kept
    await raw(leader, "UPDATE changes SET at = at - 3600")
    assert await prune(leader, keep_seconds=600, keep_rows=2) == 4  # the newest 2 kept
    assert [c.seq for c in await changes_after(leader, latest - 2)] == [latest - 1, latest]
    with pytest.raises(TooFarBehind, match="take a new snapshot"):
        await changes_after(leader, latest - 3)
    with pytest.raises(TooFarBehind):
        await changes_after(leader, 0)

    assert await prune(leader, keep_seconds=600, keep_rows=0) == 2
    assert await changes_after(leader, latest) == []  # caught up is not behind
    assert await latest_seq(leader) == latest  # the counter outlives its rows
    with pytest.raises(TooFarBehind):
        await changes_after(leader, latest - 1)
    with pytest.raises(TooFarBehind, match="never made"):
        await changes_after(leader, latest + 1)
    await leader.put_setting("s9", "9")
    assert [c.seq for c in await changes_after(leader, latest)] == [latest + 1]


async def test_a_fresh_store_has_no_changes_and_is_not_behind(leader: SQLiteStore) -> None:
    assert await latest_seq(leader) == 0
    assert await changes_after(leader, 0) == []
    assert await applied(leader) == (0, None, None)


# ---------------------------------------------------------------------- refusals


def _upsert(seq: int, table: str, row: dict[str, Any], pk: dict[str, Any] | None = None) -> Change:
    return Change(seq, table, "upsert", pk or {"key": row.get("key")}, row)


GOOD = _upsert(1, "settings", {"key": "a", "value": "1"})
# A change that must not be applied, and what the refusal says.
BAD = {
    "an unknown table": (_upsert(2, "sqlite_master", {"key": "b"}), "not a replicated table"),
    "the change log": (_upsert(2, "changes", {"key": "b"}), "not a replicated table"),
    "the bookkeeping": (
        _upsert(2, "replica_state", {"key": "applied_seq", "value": "9"}),
        "not a replicated table",
    ),
    "an unknown column": (
        _upsert(2, "settings", {"key": "b", "value": "2", "evil": 1}),
        "change 2 (settings): no column evil",
    ),
    "a column to inject": (
        _upsert(2, "settings", {"key": "b", 'value" = 1; --': "x"}),
        'no column value" = 1; --',
    ),
    "a wrong key": (
        _upsert(2, "settings", {"key": "b", "value": "2"}, {"value": "2"}),
        "key ['value'], the table's is ['key']",
    ),
    "a key the row lacks": (
        _upsert(2, "settings", {"value": "2"}, {"key": "b"}),
        "the row's key is not",
    ),
    "a local setting": (
        _upsert(2, "settings", {"key": "local.role", "value": "x"}),
        "'local.role' is not replicated",
    ),
    "a null key": (Change(2, "settings", "delete", {"key": None}, None), "a key column is null"),
    "a gap": (_upsert(3, "settings", {"key": "b", "value": "2"}), "change 2 is missing"),
    # Refused by the schema itself, half-way through the batch.
    "a missing required value": (
        _upsert(2, "settings", {"key": "b", "value": None}),
        "NOT NULL constraint failed: settings.value",
    ),
}


@pytest.mark.parametrize(("bad", "said"), list(BAD.values()), ids=list(BAD))
async def test_a_bad_change_refuses_its_whole_batch(
    standby: SQLiteStore, bad: Change, said: str
) -> None:
    before = await dump(standby)
    with pytest.raises((ChangeRefused, sqlite3.IntegrityError)) as refused:
        await apply(standby, [GOOD, bad], "cp1", 1)
    assert said in str(refused.value)
    assert await dump(standby) == before
    assert await applied(standby) == (0, None, None)
    assert await latest_seq(standby) == 0
    assert await apply(standby, [GOOD], "cp1", 1) == 1  # the store is left usable


async def test_changes_from_an_older_term_are_refused(standby: SQLiteStore) -> None:
    assert await apply(standby, [GOOD], "cp2", 2) == 1
    with pytest.raises(ChangeRefused, match="term 1"):
        await apply(standby, [_upsert(2, "settings", {"key": "b", "value": "2"})], "cp1", 1)
    assert await applied(standby) == (1, "cp2", 2)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"seq": 0, "table": "settings", "op": "delete", "pk": {"key": "a"}, "row": None},
        {"seq": True, "table": "settings", "op": "delete", "pk": {"key": "a"}, "row": None},
        {"seq": 1, "table": 5, "op": "delete", "pk": {"key": "a"}, "row": None},
        {"seq": 1, "table": "settings", "op": "drop", "pk": {"key": "a"}, "row": None},
        {"seq": 1, "table": "settings", "op": "delete", "pk": {}, "row": None},
        {"seq": 1, "table": "settings", "op": "delete", "pk": {"key": "a"}, "row": {"k": 1}},
        {"seq": 1, "table": "settings", "op": "upsert", "pk": {"key": "a"}, "row": None},
        {"seq": 1, "table": "settings", "op": "upsert", "pk": {"key": "a"}, "row": {"v": [1]}},
        {"seq": 1, "table": "settings", "op": "upsert", "pk": {"key": True}, "row": {"v": 1}},
    ],
)
def test_a_malformed_change_is_refused_when_read(data: Any) -> None:
    with pytest.raises(ChangeRefused):
        Change.from_json(data)


def test_a_change_reads_back_what_it_wrote() -> None:
    change = Change(7, "nodes", "upsert", {"id": "n1"}, {"id": "n1", "x": 0.1, "y": None})
    assert Change.from_json(json.loads(json.dumps(change.as_json()))) == change
    gone = Change(8, "nodes", "delete", {"id": "n1"}, None)
    assert Change.from_json(gone.as_json()) == gone
