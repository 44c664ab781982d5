"""``llmgw server promote`` on a standby that is not running: its store and server.yaml
say it leads from its next start, with the next term; with PostgreSQL it is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.client import UsageError
from llmgw.config import format_hostport
from llmgw.server.datadir import DataDir, init
from llmgw.server.ha.commands import promote
from llmgw.server.store import open_store
from tests.support.ports import free_port


def standby(tmp_path: Path) -> DataDir:
    root = tmp_path / "data"
    init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"], name="cp-b",
         peer_port=free_port())  # fmt: skip
    data = DataDir(root)
    data.remember_role("standby", format_hostport("127.0.0.1", free_port()))
    return data


def test_a_standby_not_running_is_promoted_in_its_files(tmp_path: Path) -> None:
    data = standby(tmp_path)
    answer = asyncio.run(promote(data.root, force=False))
    assert answer == {"name": "cp-b", "role": "leader", "term": 2, "offline": True}
    config = data.load_config()
    assert (config.ha.role, config.ha.leader) == ("leader", None)

    async def read() -> tuple[str | None, str | None]:
        store = await open_store(config, data.root)
        try:
            return await store.get_setting("ha.term"), await store.get_setting("ha.leader")
        finally:
            await store.close()

    assert asyncio.run(read()) == ("2", "cp-b")
    with pytest.raises(UsageError, match="already leads"):
        asyncio.run(promote(data.root, force=False))


def test_promote_is_refused_on_postgres_where_the_lease_decides(tmp_path: Path) -> None:
    data = standby(tmp_path)
    text = data.config_path.read_text().replace("backend: sqlite", "backend: postgres")
    data.config_path.write_text(text)
    with pytest.raises(UsageError, match="leadership moves by itself"):
        asyncio.run(promote(data.root, force=False))
