"""``AdminTokens``: the tokens that open the admin API and pages, and rotating them, over
a real SQLite store: the new token is the only one, at once; the old one and the page
sessions opened with it end; the audit trail names who, never the token; the data dir's
admin.token is replaced whole and private; a standby or a non-admin is refused."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw import pki
from llmgw.config import ServerConfig, StoreConfig
from llmgw.server.admintokens import ROTATE, AdminTokens
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.sessions import Sessions
from llmgw.server.store import Store, open_store

OLD = "llmgw-admin-old"
ADMIN = Principal("admin@10.0.0.7", "admin", "token")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    config = ServerConfig(store=StoreConfig(backend="sqlite", dsn="store.db"))
    opened = await open_store(config, tmp_path)
    await opened.add_admin_token("initial", pki.token_hash(OLD))
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin.token"
    pki.write_private(path, (OLD + "\n").encode())
    return path


async def test_the_new_token_is_the_only_one_at_once_and_audited_without_it(
    store: Store, token_file: Path
) -> None:
    tokens = AdminTokens(store, lambda: True, token_file)
    await tokens.load()
    assert tokens.ok(OLD)
    new, kept = await tokens.rotate(ADMIN)
    assert new.startswith("llmgw-admin-") and new != OLD
    assert tokens.ok(new) and not tokens.ok(OLD)
    assert await store.admin_token_hashes() == [pki.token_hash(new)]
    (entry,) = [a for a in await store.audit_log() if a["action"] == ROTATE]
    assert (entry["actor"], entry["target"]) == ("admin@10.0.0.7", "admin token")
    assert entry["detail"] == "replaced 1 token; their sessions end"
    for secret in (new, pki.token_hash(new), OLD, pki.token_hash(OLD)):
        assert all(secret not in str(value) for value in entry.values())
    # Another control plane reading the store (as a standby reloads) agrees.
    other = AdminTokens(store, lambda: False)
    await other.load()
    assert other.ok(new) and not other.ok(OLD)
    assert kept == token_file


async def test_the_data_dirs_token_file_is_replaced_whole_and_private(
    store: Store, token_file: Path
) -> None:
    tokens = AdminTokens(store, lambda: True, token_file)
    await tokens.load()
    new, kept = await tokens.rotate(ADMIN)
    assert kept == token_file
    assert token_file.read_text() == new + "\n"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert sorted(p.name for p in token_file.parent.iterdir() if "admin.token" in p.name) == [
        "admin.token"
    ]  # no part file left beside it


async def test_a_token_file_that_cannot_be_written_leaves_the_rotation_done(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    in_the_way = tmp_path / "admin.token"
    in_the_way.mkdir()  # a directory where the file goes: the rename fails
    tokens = AdminTokens(store, lambda: True, in_the_way)
    await tokens.load()
    new, kept = await tokens.rotate(ADMIN)
    assert kept is None and tokens.ok(new) and not tokens.ok(OLD)
    assert "could not be rewritten" in caplog.text and new not in caplog.text
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


async def test_the_page_sessions_opened_with_the_old_token_end(store: Store) -> None:
    tokens = AdminTokens(store, lambda: True)
    await tokens.load()
    sessions = Sessions(b"s" * 32, tokens.hashes)
    cookie = sessions.open("admin@10.0.0.7", "admin", pki.token_hash(OLD))
    assert sessions.read(cookie) is not None
    new, _ = await tokens.rotate(ADMIN)
    assert sessions.read(cookie) is None
    assert sessions.read(sessions.open("admin", "admin", pki.token_hash(new))) is not None


async def test_a_standby_refuses_and_changes_nothing(store: Store, token_file: Path) -> None:
    tokens = AdminTokens(store, lambda: False, token_file)
    await tokens.load()
    with pytest.raises(Refusal) as refused:
        await tokens.rotate(ADMIN)
    assert (refused.value.status, refused.value.code) == (409, "not_leader")
    assert "rotate it on the leader" in refused.value.message
    assert tokens.ok(OLD) and await store.admin_token_hashes() == [pki.token_hash(OLD)]
    assert token_file.read_text() == OLD + "\n"


@pytest.mark.parametrize("role", ["viewer", "operator"])
async def test_only_an_admin_may_rotate(store: Store, role: str) -> None:
    tokens = AdminTokens(store, lambda: True)
    await tokens.load()
    with pytest.raises(Refusal) as refused:
        await tokens.rotate(Principal("someone", role, "session"))  # type: ignore[arg-type]
    assert refused.value.status == 403
    assert tokens.ok(OLD) and await store.admin_token_hashes() == [pki.token_hash(OLD)]
