"""llmgw's firewall as the cluster decides it: server.yaml's as the base, an operator's
changes over it kept in the store, audited, announced, and refused whole when bad."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.config import FirewallConfig
from llmgw.server.fleet.firewall import SETTING, FleetFirewall
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import FirewallSet
from llmgw.server.store import SQLiteStore

ADMIN_X = Principal("admin@x", "admin", "token")
YAML = FirewallConfig(enabled=True, networks=["10.0.0.0/8"])


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "s.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


class Told:
    def __init__(self) -> None:
        self.times = 0

    def __call__(self) -> None:
        self.times += 1


async def test_the_base_is_server_yaml_and_a_change_goes_over_it_live(store: SQLiteStore) -> None:
    told = Told()
    wall = FleetFirewall(store, YAML, told)
    await wall.load()
    assert wall.current == YAML
    assert wall.document() == {
        "version": 0,
        "enabled": True,
        "networks": ["10.0.0.0/8"],
        "source": {"enabled": "server.yaml", "networks": "server.yaml"},
    }

    doc = await wall.ask(FirewallSet(enabled=False), ADMIN_X)
    assert doc["enabled"] is False and doc["networks"] == ["10.0.0.0/8"]
    assert doc["source"] == {"enabled": "ctl", "networks": "server.yaml"}
    assert wall.current == FirewallConfig(enabled=False, networks=["10.0.0.0/8"])
    assert told.times == 1  # every agent is sent it again, now

    doc = await wall.ask(FirewallSet(networks=(" 192.168.4.0/24", "fd00::/8")), ADMIN_X)
    assert doc["networks"] == ["192.168.4.0/24", "fd00::/8"] and doc["version"] == 2
    assert told.times == 2

    # Kept in the store: a control plane started again (or a standby) reads it.
    again = FleetFirewall(store, YAML, Told())
    await again.load()
    assert again.current == FirewallConfig(enabled=False, networks=["192.168.4.0/24", "fd00::/8"])
    assert again.version == 2

    # Unset: server.yaml's again, and that is a change the agents hear of too.
    doc = await wall.ask(FirewallSet(unset=True), ADMIN_X)
    assert wall.current == YAML and doc["source"]["enabled"] == "server.yaml"
    assert told.times == 3
    changes = await wall.history()
    assert [(c["actor"], c["action"], c["change"]) for c in changes] == [
        ("admin@x", "firewall.unset", "back to server.yaml"),
        ("admin@x", "firewall.set", 'networks = ["192.168.4.0/24", "fd00::/8"]'),
        ("admin@x", "firewall.set", "enabled = false"),
    ]
    # An empty list of networks is a value (any network), not "unset".
    await wall.ask(FirewallSet(networks=()), ADMIN_X)
    assert wall.current.networks == [] and wall.document()["source"]["networks"] == "ctl"


@pytest.mark.parametrize(
    ("ask", "field", "words"),
    [
        (FirewallSet(networks=("10.0.0.5/24",)), "networks", "'10.0.0.5/24'"),
        (FirewallSet(networks=("10.0.0.0/8", "nowhere")), "networks", "'nowhere'"),
        (FirewallSet(), "enabled", "give enabled, networks or both"),
        (FirewallSet(enabled=True, unset=True), "unset", "give it alone"),
    ],
)
async def test_a_bad_change_is_refused_naming_the_field_and_nothing_changes(
    store: SQLiteStore, ask: FirewallSet, field: str, words: str
) -> None:
    told = Told()
    wall = FleetFirewall(store, YAML, told)
    await wall.load()
    with pytest.raises(Refusal) as refused:
        await wall.ask(ask, ADMIN_X)
    assert refused.value.status == 400 and refused.value.field == field
    assert words in refused.value.message
    assert wall.current == YAML and wall.version == 0 and told.times == 0
    assert await store.get_setting(SETTING) is None
