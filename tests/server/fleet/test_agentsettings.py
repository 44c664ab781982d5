"""The agents' settings the cluster decides: a default layer and each node's over it,
checked against agent.yaml's own schema, audited, kept in the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.server.fleet.agentsettings import AgentSettings, SettingsError, settable_keys
from llmgw.server.principal import Principal
from llmgw.server.store import SQLiteStore

# The caller, as the audit log names them.
ADMIN_X = Principal("admin@x", "admin", "token")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "s.db")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_a_nodes_own_value_wins_on_it_and_sections_merge(store: SQLiteStore) -> None:
    changes: list[int] = []
    settings = AgentSettings(store, on_change=lambda: changes.append(settings.version))
    await settings.set("heartbeat_interval", 2.0, None, ADMIN_X)
    await settings.set("discovery.slow_interval", 30, None, ADMIN_X)
    await settings.set("heartbeat_interval", 1.0, "gpu01", ADMIN_X)
    await settings.set("discovery.nvidia_smi", "/opt/nv/nvidia-smi", "gpu01", ADMIN_X)
    assert changes == [1, 2, 3, 4]
    assert settings.for_node("gpu01") == {
        "heartbeat_interval": 1.0,
        "discovery": {"slow_interval": 30, "nvidia_smi": "/opt/nv/nvidia-smi"},
    }
    assert settings.for_node("gpu02") == {
        "heartbeat_interval": 2.0,
        "discovery": {"slow_interval": 30},
    }
    assert settings.get("heartbeat_interval", "gpu01") == 1.0
    assert settings.get("engine_user") is None

    # Kept in the store: a control plane started again has them, at the same version.
    again = AgentSettings(store, on_change=lambda: None)
    await again.load()
    assert again.document() == settings.document() and again.version == 4

    await settings.set("discovery.nvidia_smi", None, "gpu01", ADMIN_X)
    await settings.set("heartbeat_interval", None, "gpu01", ADMIN_X)
    assert "gpu01" not in settings.document()["nodes"]  # an emptied layer goes
    history = await settings.history()
    assert [h["action"] for h in history][:2] == ["agents.unset", "agents.unset"]
    assert history[-1] == {
        "at": history[-1]["at"],
        "actor": "admin@x",
        "action": "agents.set",
        "layer": "agents.default",
        "change": "heartbeat_interval = 2.0",
    }


async def test_a_bad_key_or_value_is_refused_naming_it_and_nothing_changes(
    store: SQLiteStore,
) -> None:
    settings = AgentSettings(store, on_change=lambda: None)
    await settings.set("release_source", "https://mirror.example/llama.cpp", None, ADMIN_X)
    before = (settings.document(), settings.version, len(await settings.history()))
    refusals = [
        ("heartbeat_intervall", 5, "no such agent setting"),
        ("server", "cp:8080", "identity"),
        ("heartbeat_interval", "soon", "heartbeat_interval"),
        ("heartbeat_interval", -1, "heartbeat_interval"),
        ("engines", ["llama.cpp"], "engines"),
        ("discovery.dcgm_exporter", "ftp://x", "dcgm_exporter"),
        ("discovery.nope", 1, "no such agent setting"),
    ]
    for key, value, words in refusals:
        with pytest.raises(SettingsError, match=words):
            await settings.set(key, value, None, ADMIN_X)
    after = (settings.document(), settings.version, len(await settings.history()))
    assert after == before


def test_the_cluster_sets_everything_agent_yaml_says_but_identity() -> None:
    keys = settable_keys()
    assert "heartbeat_interval" in keys and "discovery.slow_interval" in keys
    assert "engines" in keys and "llamacpp_version" in keys
    assert not {"server", "token", "node_id", "state_dir"} & set(keys)


async def test_fleet_detail_is_the_control_planes_own_and_auto_by_fleet_size(
    store: SQLiteStore,
) -> None:
    changes: list[int] = []
    settings = AgentSettings(store, on_change=lambda: changes.append(settings.version))
    assert "metrics.fleet_detail" in settable_keys()
    # auto (the default): on up to 500 nodes.
    assert settings.fleet_detail(500) and not settings.fleet_detail(501)
    assert settings.get("metrics.fleet_detail") is None
    # YAML reads a bare `off` as false: taken as off.
    await settings.set("metrics.fleet_detail", False, None, ADMIN_X)
    assert not settings.fleet_detail(3)
    await settings.set("metrics.fleet_detail", "on", None, ADMIN_X)
    assert settings.fleet_detail(5000)
    assert settings.get("metrics.fleet_detail") == "on"
    # The agents are not told (none runs with it), nor given it.
    assert changes == [] and settings.for_node("gpu01") == {}
    with pytest.raises(SettingsError, match="auto, on, off"):
        await settings.set("metrics.fleet_detail", "sometimes", None, ADMIN_X)
    with pytest.raises(SettingsError, match="whole cluster"):
        await settings.set("metrics.fleet_detail", "off", "gpu01", ADMIN_X)
    assert settings.get("metrics.fleet_detail") == "on"  # a refusal changes nothing

    again = AgentSettings(store, on_change=lambda: None)
    await again.load()
    assert again.document()["cluster"] == {"metrics.fleet_detail": "on"}
    await settings.set("metrics.fleet_detail", None, None, ADMIN_X)
    assert settings.fleet_detail(500) and not settings.fleet_detail(501)
    history = await settings.history()
    assert [(h["layer"], h["change"]) for h in history[:2]] == [
        ("cluster", "metrics.fleet_detail"),
        ("cluster", 'metrics.fleet_detail = "on"'),
    ]
