"""The settings the cluster gives this agent (``ctl config``), kept in its state dir.

What an agent runs with is, key by key, the first of: its agent.yaml (``file``), the
node's own layer (``node``), the cluster's default layer (``cluster``), llmgw's default
(``default``). The cluster's layers come in an ``AgentSettings`` message after every
Register and on every change; they are checked against agent.yaml's schema with the file
over them (refused whole, keeping the last good ones, when they do not build), written
to ``STATE_DIR/cluster-settings.json``, and read again at every start. When what the
agent would run with changes, it starts itself again (its engines keep serving: a new
agent adopts them), since most settings are read once at start.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Literal, TypedDict

import yaml

from llmgw.config import (
    AGENT_IDENTITY,
    AgentConfig,
    ConfigError,
    Settings,
    agent_sections,
    agent_setting_keys,
    build,
    merge_agent_layers,
)

log = logging.getLogger("llmgw.agent.settings")

FILE = "cluster-settings.json"

# Where a setting an agent runs with came from, the first of these that names it.
Source = Literal["file", "node", "cluster", "default"]


class SettingValue(TypedDict):
    value: object  # as the setting's field holds it (a number, a string, a list...)
    source: Source


class SettingsReport(TypedDict):
    """What an agent runs with, for Register and ``llmgw doctor``."""

    version: int  # of the cluster's settings it holds
    values: dict[str, SettingValue]  # by dotted key, ``discovery.slow_interval``
    problem: str | None  # why the cluster's last settings were refused


def _flat(layer: Settings) -> dict[str, object]:
    """``{"discovery": {"x": 1}}`` as ``{"discovery.x": 1}``."""
    out: dict[str, object] = {}
    for key, value in layer.items():
        if key in agent_sections() and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _value(config: AgentConfig, key: str) -> object:
    found: object = config
    for part in key.split("."):
        found = getattr(found, part)
    return copy.deepcopy(found)


class ClusterSettings:
    """The cluster's two layers as last accepted, and the file's, for one agent."""

    def __init__(self, state_dir: Path, file_layer: Settings) -> None:
        self.path = state_dir / FILE
        self.file = {k: v for k, v in file_layer.items() if k not in AGENT_IDENTITY}
        self.version = 0
        self.default: dict[str, object] = {}
        self.node: dict[str, object] = {}
        self.problem: str | None = None
        try:
            saved = json.loads(self.path.read_text())
            self.version = int(saved.get("version") or 0)
            self.default = dict(saved.get("default") or {})
            self.node = dict(saved.get("node") or {})
        except FileNotFoundError:
            pass
        except (ValueError, OSError) as exc:
            log.warning(
                "%s cannot be read (%s); starting without the cluster's settings", self.path, exc
            )

    @classmethod
    def read_file(cls, path: Path | None) -> dict[str, object]:
        """agent.yaml as written (only what it says), for where each setting came from."""
        if path is None:
            return {}
        data = yaml.safe_load(path.read_text()) or {}
        return dict(data) if isinstance(data, dict) else {}

    def _merged(self, default: Settings, node: Settings) -> dict[str, object]:
        return merge_agent_layers(merge_agent_layers(default, node), self.file)

    def config(self, identity: AgentConfig) -> AgentConfig:
        """What the agent runs with: the layers over llmgw's defaults, and the identity
        (server, token, node id, state dir) from ``identity``, the file's."""
        built = build(AgentConfig, self._merged(self.default, self.node), "agent settings")
        return dataclasses.replace(built, **{k: getattr(identity, k) for k in AGENT_IDENTITY})

    def accept(self, version: int, default: dict[str, object], node: dict[str, object]) -> bool:
        """Take the cluster's layers; True when what the agent runs with changes (it
        should start again). Layers that do not build are refused, the last kept."""
        if version == self.version and default == self.default and node == self.node:
            return False
        try:
            before = build(AgentConfig, self._merged(self.default, self.node), "agent settings")
            after = build(AgentConfig, self._merged(default, node), "the cluster's settings")
        except ConfigError as exc:
            self.problem = f"settings version {version} refused: {exc}"
            log.warning("%s", self.problem)
            return False
        self.version, self.default, self.node, self.problem = version, default, node, None
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": version, "default": default, "node": node}))
        os.replace(tmp, self.path)
        return before != after

    def report(self, running: AgentConfig) -> SettingsReport:
        """For Register: each setting's value and where it came from, and the version."""
        default, node, file = _flat(self.default), _flat(self.node), _flat(self.file)
        values: dict[str, SettingValue] = {}
        for key in agent_setting_keys():
            source: Source = (
                "file"
                if key in file
                else "node"
                if key in node
                else "cluster"
                if key in default
                else "default"
            )
            values[key] = {"value": _value(running, key), "source": source}
        return {"version": self.version, "values": values, "problem": self.problem}


def summary(state_dir: Path) -> tuple[bool, str]:
    """For ``llmgw doctor``: (good, what this node's agent runs with that is not llmgw's
    default, each with where it came from, and the version of the cluster's it holds)."""
    config_path = state_dir / "agent.yaml"
    file = ClusterSettings.read_file(config_path if config_path.exists() else None)
    settings = ClusterSettings(state_dir, file)
    try:
        running = settings.config(build(AgentConfig, file, str(config_path)))
    except ConfigError as exc:
        return False, f"the settings do not build: {exc}"
    report = settings.report(running)
    said = [
        f"{key}={json.dumps(v['value'])} ({v['source']})"
        for key, v in report["values"].items()
        if v["source"] != "default"
    ]
    head = f"the cluster's settings version {report['version']}"
    return True, f"{head}; " + ("; ".join(said) if said else "everything else llmgw's defaults")
