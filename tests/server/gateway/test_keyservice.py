"""``KeyService`` and ``ServingSwitch`` over a real SQLite store: a key is shown once and
only its hash kept, each change is audited under the caller's name, usage is read by
days or by a range whose bad ends are refused naming the field, energy per token only
where power was read; the serving switch is kept, audited and applied on change."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.server.gateway.keyservice import (
    STOPPED_SETTING,
    KeyService,
    ServingSwitch,
    key_json,
)
from llmgw.server.gateway.limits import KEY_PREFIX, Key, KeyBook, Usage, key_hash
from llmgw.server.people.directory import Directory
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import CreateKey, UpdateKey, UsageQuery
from llmgw.server.store import SQLiteStore, StoreUnavailable

# Noon UTC on 2026-06-15: "today" for every test here.
NOW = dt.datetime(2026, 6, 15, 12, 0, tzinfo=dt.UTC).timestamp()
ALICE = Principal("alice@10.0.0.5", "admin", "token")


@dataclass
class Keys:
    """A KeyService and what it was built with, for tests to look at or change."""

    service: KeyService
    store: SQLiteStore
    usage: Usage
    tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    joules: dict[str, float] = field(default_factory=dict)


@pytest.fixture
async def keys(tmp_path: Path) -> AsyncIterator[Keys]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    usage = Usage(store, clock=lambda: NOW)
    book = KeyBook(usage, clock=lambda: NOW)
    tokens: dict[tuple[str, str], int] = {}
    joules: dict[str, float] = {}
    directory = Directory(store)
    await directory.load()
    service = KeyService(
        store,
        book,
        usage.flush,
        tokens,
        lambda r: joules.get(r, 0.0),
        directory,
        clock=lambda: NOW,
    )
    try:
        yield Keys(service, store, usage, tokens, joules)
    finally:
        await store.close()


# ------------------------------------------------------------------ create


async def test_a_new_key_is_shown_once_and_only_its_hash_is_kept(keys: Keys) -> None:
    record, key = await keys.service.create(
        CreateKey(name="  web  ", models=("qwen*",), rpm=10, priority=2), ALICE
    )
    assert key.startswith(KEY_PREFIX) and len(key) > len(KEY_PREFIX) + 20
    assert record.name == "web" and record.key_hash == key_hash(key)
    assert (record.models, record.rpm, record.priority) == (("qwen*",), 10, 2)
    assert record.created_at == NOW and record.expires_at is None

    (stored,) = await keys.store.list_api_keys()
    assert stored.id == record.id and stored.key_hash == key_hash(key)
    # The key itself is nowhere in what is kept, nor in what the API shows.
    assert key not in repr(stored)
    shown = key_json(stored, NOW)
    assert key not in repr(shown) and "key_hash" not in shown
    # The gateway knows it at once, by its hash.
    assert keys.service.keys.keys[key_hash(key)].record == record

    (entry,) = await keys.store.audit_log()
    assert (entry["actor"], entry["action"], entry["target"]) == (
        "alice@10.0.0.5",
        "key.create",
        record.id,
    )
    assert entry["detail"] == "web; models qwen*; priority 2"


async def test_two_keys_differ_and_a_key_for_all_models_says_so(keys: Keys) -> None:
    first, key1 = await keys.service.create(CreateKey(name="a"), ALICE)
    second, key2 = await keys.service.create(CreateKey(name="b"), ALICE)
    assert key1 != key2 and first.id != second.id
    details = sorted(e["detail"] for e in await keys.store.audit_log())
    assert details == ["a; models all", "b; models all"]


async def test_an_expiry_is_read_as_a_date_or_seconds_and_a_past_one_is_refused(
    keys: Keys,
) -> None:
    dated, _ = await keys.service.create(CreateKey(name="d", expires="2027-01-31"), ALICE)
    assert dated.expires_at == dt.datetime(2027, 1, 31, tzinfo=dt.UTC).timestamp()
    zoned, _ = await keys.service.create(
        CreateKey(name="z", expires="2027-01-31T02:00:00+02:00"), ALICE
    )
    assert zoned.expires_at == dated.expires_at
    seconds, _ = await keys.service.create(CreateKey(name="s", expires=NOW + 60.0), ALICE)
    assert seconds.expires_at == NOW + 60.0

    for past in ("2026-06-14", NOW, NOW - 1.0):
        with pytest.raises(Refusal) as refused:
            await keys.service.create(CreateKey(name="late", expires=past), ALICE)
        assert (refused.value.status, refused.value.field) == (400, "expires")
        assert "passed" in refused.value.message
    with pytest.raises(Refusal) as refused:
        await keys.service.create(CreateKey(name="bad", expires="next tuesday"), ALICE)
    assert (refused.value.status, refused.value.field) == (400, "expires")
    assert "'next tuesday' is not a date" in refused.value.message
    # Nothing refused was kept.
    assert sorted(r.name for r in await keys.store.list_api_keys()) == ["d", "s", "z"]


def test_a_keys_state_is_active_expired_or_revoked() -> None:
    from llmgw.server.store import ApiKeyRecord

    record = ApiKeyRecord(id="k1", name="n", key_hash="h", expires_at=NOW + 10)
    assert key_json(record, NOW)["state"] == "active"
    assert key_json(record, NOW + 10)["state"] == "expired"
    revoked = ApiKeyRecord(id="k1", name="n", key_hash="h", revoked_at=NOW - 5)
    assert key_json(revoked, NOW)["state"] == "revoked"


# ------------------------------------------------------------------ revoke, update


async def test_revoking_is_at_once_audited_once_and_idempotent(keys: Keys) -> None:
    record, key = await keys.service.create(CreateKey(name="web"), ALICE)
    bob = Principal("bob@10.0.0.6", "operator", "session")
    revoked = await keys.service.revoke(record.id, bob)
    assert revoked.revoked_at == NOW
    assert keys.service.keys.keys[key_hash(key)].record.revoked_at == NOW
    assert (await keys.store.list_api_keys())[0].revoked_at == NOW

    # A second revoke, later, leaves the key as it was and writes no second entry.
    keys.service.clock = lambda: NOW + 100
    again = await keys.service.revoke(record.id, bob)
    assert again.revoked_at == NOW
    assert (await keys.store.list_api_keys())[0].revoked_at == NOW
    actions = [(e["actor"], e["action"]) for e in await keys.store.audit_log()]
    assert actions == [("bob@10.0.0.6", "key.revoke"), ("alice@10.0.0.5", "key.create")]


async def test_an_unknown_key_is_404_for_revoke_and_update(keys: Keys) -> None:
    for call in (
        keys.service.revoke("nope", ALICE),
        keys.service.update("nope", UpdateKey(priority=1), ALICE),
    ):
        with pytest.raises(Refusal) as refused:
            await call
        assert (refused.value.status, refused.value.code) == (404, "not_found")
        assert "llmgw ctl keys list" in refused.value.message
    assert await keys.store.audit_log() == []


async def test_a_keys_priority_changes_in_the_store_the_gateway_and_the_audit(
    keys: Keys,
) -> None:
    record, key = await keys.service.create(CreateKey(name="batch"), ALICE)
    updated = await keys.service.update(record.id, UpdateKey(priority=-5), ALICE)
    assert updated.priority == -5 and updated.id == record.id and updated.name == "batch"
    assert keys.service.keys.keys[key_hash(key)].record.priority == -5
    assert (await keys.store.list_api_keys())[0].priority == -5
    (entry, _) = await keys.store.audit_log()
    assert (entry["action"], entry["target"], entry["detail"]) == (
        "key.update",
        record.id,
        "priority -5",
    )


async def test_a_key_gone_from_the_store_is_404_on_update(keys: Keys) -> None:
    """The gateway's copy still knows it (another control plane removed the row)."""
    record, _ = await keys.service.create(CreateKey(name="gone"), ALICE)
    await keys.store._execute("DELETE FROM api_keys WHERE id = ?", (record.id,))
    with pytest.raises(Refusal) as refused:
        await keys.service.update(record.id, UpdateKey(priority=3), ALICE)
    assert refused.value.status == 404
    assert keys.service.find(record.id, ALICE).priority == 0


# ------------------------------------------------------------------ usage


async def _usage_on(keys: Keys, key_id: str, *days: str) -> None:
    await keys.store.add_usage([(d, key_id, "m", "r1", 1, 10, 5) for d in days])


async def test_usage_is_the_days_back_today_included_with_each_keys_name(keys: Keys) -> None:
    record, _ = await keys.service.create(CreateKey(name="web"), ALICE)
    await _usage_on(keys, record.id, "2026-06-12", "2026-06-13", "2026-06-15")
    await _usage_on(keys, "gone-key", "2026-06-14")
    rows = await keys.service.usage(UsageQuery(days=3), ALICE)
    assert [(r["day"], r["key_name"]) for r in rows] == [
        ("2026-06-13", "web"),
        ("2026-06-14", None),
        ("2026-06-15", "web"),
    ]
    assert len(await keys.service.usage(UsageQuery(), ALICE)) == 4  # 30 days by default


async def test_usage_from_since_to_until_both_included(keys: Keys) -> None:
    record, _ = await keys.service.create(CreateKey(name="web"), ALICE)
    days = ("2026-05-31", "2026-06-01", "2026-06-05", "2026-06-10", "2026-06-11")
    await _usage_on(keys, record.id, *days)

    def on(rows: list[dict[str, object]]) -> list[object]:
        return [r["day"] for r in rows]

    ranged = await keys.service.usage(UsageQuery(since="2026-06-01", until="2026-06-10"), ALICE)
    assert on(ranged) == ["2026-06-01", "2026-06-05", "2026-06-10"]
    # since alone runs to today; until alone is the `days` up to it.
    assert on(await keys.service.usage(UsageQuery(since="2026-06-05"), ALICE)) == list(days[2:])
    assert on(await keys.service.usage(UsageQuery(days=10, until="2026-06-10"), ALICE)) == [
        "2026-06-01",
        "2026-06-05",
        "2026-06-10",
    ]
    one_day = await keys.service.usage(UsageQuery(since="2026-06-05", until="2026-06-05"), ALICE)
    assert on(one_day) == ["2026-06-05"]


@pytest.mark.parametrize(
    ("query", "blamed"),
    [
        (UsageQuery(since="2026-06-10", until="2026-06-01"), "since"),
        (UsageQuery(since="2026-13-01"), "since"),
        (UsageQuery(until="2026-02-30"), "until"),
        (UsageQuery(since="June 1st"), "since"),
        (UsageQuery(until="2026-6-1"), "until"),
        (UsageQuery(since="2026-06-01T00"), "since"),
    ],
)
async def test_a_bad_range_is_refused_naming_the_field(
    keys: Keys, query: UsageQuery, blamed: str
) -> None:
    with pytest.raises(Refusal) as refused:
        await keys.service.usage(query, ALICE)
    assert (refused.value.status, refused.value.field) == (400, blamed)
    assert refused.value.message.startswith(f"{blamed}: ")


async def test_usage_writes_what_was_counted_first(keys: Keys) -> None:
    record, _ = await keys.service.create(CreateKey(name="web"), ALICE)
    keys.usage.add(Key(record), "m", "r1", prompt=7, completion=3)
    (row,) = await keys.service.usage(UsageQuery(days=1), ALICE)
    assert (row["day"], row["key_id"], row["requests"]) == ("2026-06-15", record.id, 1)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (7, 3)
    assert keys.usage.pending == {}


async def test_usage_shows_the_stores_rows_when_the_counts_cannot_be_written(
    keys: Keys,
) -> None:
    record, _ = await keys.service.create(CreateKey(name="web"), ALICE)
    await _usage_on(keys, record.id, "2026-06-15")

    async def unwritable() -> None:
        raise StoreUnavailable("the disk is full")

    keys.service.flush = unwritable
    (row,) = await keys.service.usage(UsageQuery(days=1), ALICE)
    assert row["requests"] == 1 and row["key_name"] == "web"


# ------------------------------------------------------------------ energy


def test_energy_per_token_only_where_power_was_read_and_tokens_answered(keys: Keys) -> None:
    keys.tokens.update({("m", "r1"): 400, ("m", "r2"): 50, ("a", "r3"): 0, ("a", "r0"): 3})
    keys.joules.update({"r1": 100.0, "r3": 9.0, "r0": 1.0})
    assert keys.service.energy() == [
        {
            "model": "a",
            "replica": "r0",
            "joules": 1.0,
            "tokens": 3,
            "joules_per_token": round(1 / 3, 6),
        },
        {"model": "m", "replica": "r1", "joules": 100.0, "tokens": 400, "joules_per_token": 0.25},
    ]


# ------------------------------------------------------------------ serving switch


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "switch.db")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_serving_is_stopped_and_started_kept_and_audited(store: SQLiteStore) -> None:
    applied: list[bool] = []
    switch = ServingSwitch(store, applied.append)
    assert await switch.set(True, ALICE) is True
    assert switch.stopped and applied == [True]
    assert await store.get_setting(STOPPED_SETTING) == "true"
    assert await switch.set(False, ALICE) is False
    assert not switch.stopped and applied == [True, False]
    assert await store.get_setting(STOPPED_SETTING) == "false"
    entries = [(e["actor"], e["action"], e["target"]) for e in await store.audit_log()]
    assert entries == [
        ("alice@10.0.0.5", "serving.start", "/v1"),
        ("alice@10.0.0.5", "serving.stop", "/v1"),
    ]


async def test_load_applies_the_stores_word_first_and_then_only_on_change(
    store: SQLiteStore,
) -> None:
    applied: list[bool] = []
    switch = ServingSwitch(store, applied.append)
    await switch.load()
    assert applied == [False] and not switch.stopped  # nothing kept: serving
    await switch.load()
    assert applied == [False]
    # Another control plane stopped serving; this one's store copy changed under it.
    await store.put_setting(STOPPED_SETTING, "true")
    await switch.load()
    await switch.load()
    assert applied == [False, True] and switch.stopped
    await store.put_setting(STOPPED_SETTING, "false")
    await switch.load()
    assert applied == [False, True, False]


async def test_a_restart_loads_a_stopped_cluster_stopped(store: SQLiteStore) -> None:
    await ServingSwitch(store, lambda stopped: None).set(True, ALICE)
    applied: list[bool] = []
    after_restart = ServingSwitch(store, applied.append)
    await after_restart.load()
    assert applied == [True] and after_restart.stopped
