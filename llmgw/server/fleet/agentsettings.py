"""The agents' settings, decided by the cluster: ``agents.default`` and
``agents.nodes.<id>`` hold what an agent.yaml can say, but the node's identity, its
control planes and its certificate.

Both layers are one JSON document in the store's settings (``agents``); each change is
checked against agent.yaml's own schema (``config.AgentConfig``: a bad key or value is
refused naming it, and nothing changes), written with its audit entry
(``agents.set`` / ``agents.unset``, which ``history`` reads back), and announced through
``on_change`` so connected agents hear of it at once.

A key is dotted for a nested section (``discovery.slow_interval``). A node's effective
settings are the default layer with the node's over it, section by section.

A few keys are the control plane's own, not an agent's (``CLUSTER_KEYS``): set the same
way, for the whole cluster only, kept in the same document (``cluster``), audited
alike, and never sent to the agents.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any, TypedDict

import yaml

from llmgw.config import (
    AGENT_IDENTITY,
    AgentConfig,
    ConfigError,
    agent_setting_keys,
    build,
    merge_agent_layers,
)
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ConfigSet
from llmgw.server.store import Store

SETTING = "agents"

# The control plane's own settings: each key with the values it takes, the first its
# default. ``metrics.fleet_detail``: whether /metrics writes every node's and card's
# families (``auto``: while the fleet has at most FLEET_DETAIL_AUTO nodes).
CLUSTER_KEYS: dict[str, tuple[str, ...]] = {"metrics.fleet_detail": ("auto", "on", "off")}
FLEET_DETAIL_AUTO = 500
HISTORY_ACTIONS = ("agents.set", "agents.unset")


# One layer of settings, as an agent.yaml says them (sections as maps); checked against
# ``config.AgentConfig`` whenever it changes.
Layer = dict[str, Any]


class SettingsDocument(TypedDict):
    default: Layer
    nodes: dict[str, Layer]
    cluster: dict[str, str]  # the control plane's own keys that are set (CLUSTER_KEYS)


class SettingsChange(TypedDict):
    """One change, as the audit log keeps it."""

    at: float
    actor: str
    action: str
    layer: str
    change: str


class SettingsError(ValueError):
    """A key or value the agents' settings cannot take; says which and why."""


def settable_keys() -> list[str]:
    """Every key the cluster may set, dotted for nested sections."""
    return [*agent_setting_keys(), *CLUSTER_KEYS]


def cluster_value(key: str, value: object) -> str:
    """A control plane key's value as kept; SettingsError naming the values it takes.
    YAML reads a bare ``on`` and ``off`` as true and false: those are taken too."""
    if value is True or value is False:
        value = "on" if value else "off"
    allowed = CLUSTER_KEYS[key]
    if not isinstance(value, str) or value not in allowed:
        raise SettingsError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    return value


def check_key(key: str) -> list[str]:
    """``key`` split at its dots, or SettingsError naming the keys there are."""
    if key not in settable_keys():
        if key in AGENT_IDENTITY:
            raise SettingsError(
                f"{key}: a node's identity and where it joins stay in its agent.yaml; "
                "the cluster sets everything else"
            )
        raise SettingsError(
            f"{key}: no such agent setting (the settings are: {', '.join(settable_keys())})"
        )
    return key.split(".")


class AgentSettings:
    def __init__(self, store: Store, on_change: Callable[[], None]) -> None:
        """``on_change``: after every change (every agent is told)."""
        self.store = store
        self.default: Layer = {}
        self.nodes: dict[str, Layer] = {}
        self.cluster: dict[str, str] = {}
        # Bumped by every change: an agent reports the version it applied.
        self.version = 0
        self.on_change = on_change

    async def load(self) -> None:
        raw = await self.store.get_setting(SETTING)
        doc = json.loads(raw) if raw else {}
        self.default = dict(doc.get("default") or {})
        self.nodes = {str(k): dict(v) for k, v in (doc.get("nodes") or {}).items()}
        self.cluster = {str(k): str(v) for k, v in (doc.get("cluster") or {}).items()}
        self.version = int(doc.get("version") or 0)

    def document(self) -> SettingsDocument:
        return {
            "default": copy.deepcopy(self.default),
            "nodes": copy.deepcopy(self.nodes),
            "cluster": dict(self.cluster),
        }

    def fleet_detail(self, nodes: int) -> bool:
        """Whether /metrics writes every node's and card's families, for a fleet of
        ``nodes`` nodes (``metrics.fleet_detail``)."""
        value = self.cluster.get("metrics.fleet_detail", "auto")
        return value == "on" or (value == "auto" and nodes <= FLEET_DETAIL_AUTO)

    def for_node(self, node_id: str) -> Layer:
        """The settings the cluster gives ``node_id``: the default, its own over it."""
        return merge_agent_layers(self.default, self.nodes.get(node_id, {}))

    def get(self, key: str, node: str | None = None) -> Any:
        """A key's value in a layer (the node's, or the default), None when unset."""
        if key in CLUSTER_KEYS:
            return self.cluster.get(key)
        layer: Any = self.nodes.get(node, {}) if node else self.default
        for part in check_key(key):
            if not isinstance(layer, dict) or part not in layer:
                return None
            layer = layer[part]
        return layer

    async def ask(self, ask: ConfigSet, by: Principal) -> SettingsDocument:
        """``ctl config set|unset``: the value read as YAML, then set (or unset) as
        ``set`` does; a Refusal naming the field when it is bad."""
        if ask.unset == (ask.value is not None):
            raise Refusal(400, "bad_request", "value: give a value, or unset, not both", "value")
        value = None
        if ask.value is not None:
            try:
                value = yaml.safe_load(ask.value)
            except yaml.YAMLError as exc:
                raise Refusal(400, "bad_request", f"value: not YAML: {exc}", "value") from None
            if value is None:
                raise Refusal(
                    400, "bad_request", "value: empty; to remove a key, unset it", "value"
                )
        try:
            return await self.set(ask.key, value, ask.node, by)
        except SettingsError as exc:
            raise Refusal(400, "bad_request", str(exc), "key") from None

    async def set(
        self, key: str, value: object, node: str | None, by: Principal
    ) -> SettingsDocument:
        """Set (or, with ``value`` None, unset) ``key`` in a layer, checked and audited;
        returns the document. Nothing changes when it is refused."""
        parts = check_key(key)
        if key in CLUSTER_KEYS:
            return await self._set_cluster(key, value, node, by)
        layer = copy.deepcopy(self.nodes.get(node, {}) if node else self.default)
        where = f"agents.nodes.{node}" if node else "agents.default"
        inner = layer
        for part in parts[:-1]:
            inner = inner.setdefault(part, {})
        if value is None:
            inner.pop(parts[-1], None)
            if len(parts) > 1 and not inner:
                layer.pop(parts[0], None)
        else:
            inner[parts[-1]] = value
        try:
            build(AgentConfig, layer, where)
        except ConfigError as exc:
            raise SettingsError(str(exc)) from None
        nodes = dict(self.nodes)
        default = self.default
        if node:
            if layer:
                nodes[node] = layer
            else:
                nodes.pop(node, None)
        else:
            default = layer
        version = self.version + 1
        doc = {"default": default, "nodes": nodes, "cluster": self.cluster, "version": version}
        action = "agents.unset" if value is None else "agents.set"
        shown = key if value is None else f"{key} = {json.dumps(value)}"
        await self.store.put_setting(SETTING, json.dumps(doc, sort_keys=True))
        await self.store.audit(by.name, action, where, shown)
        self.default, self.nodes, self.version = default, nodes, version
        self.on_change()
        return self.document()

    async def _set_cluster(
        self, key: str, value: object, node: str | None, by: Principal
    ) -> SettingsDocument:
        if node:
            raise SettingsError(f"{key}: the control plane's own setting, for the whole cluster")
        cluster = dict(self.cluster)
        if value is None:
            cluster.pop(key, None)
        else:
            cluster[key] = cluster_value(key, value)
        doc = {
            "default": self.default,
            "nodes": self.nodes,
            "cluster": cluster,
            "version": self.version,
        }
        shown = key if value is None else f"{key} = {json.dumps(cluster[key])}"
        await self.store.put_setting(SETTING, json.dumps(doc, sort_keys=True))
        await self.store.audit(
            by.name, "agents.unset" if value is None else "agents.set", "cluster", shown
        )
        # The agents are not told: none of them runs with it.
        self.cluster = cluster
        return self.document()

    async def history(self, limit: int = 200) -> list[SettingsChange]:
        """The changes, newest first: when, who, the layer and what."""
        rows = await self.store.audit_log(limit=5000)
        found = [r for r in rows if r.get("action") in HISTORY_ACTIONS]
        changes: list[SettingsChange] = [
            {
                "at": r["at"],
                "actor": r["actor"],
                "action": r["action"],
                "layer": r["target"],
                "change": r["detail"],
            }
            for r in found[:limit]
        ]
        return changes
