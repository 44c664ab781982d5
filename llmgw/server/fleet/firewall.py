"""llmgw's firewall on every node, as the cluster decides it: on or off, and the networks
agents may reach a control plane's agents' port from.

server.yaml's ``firewall:`` is the base; what an operator sets at run time
(``llmgw ctl firewall``, ``POST /api/v1/firewall``) is one JSON document in the store's
settings (``firewall``) over it, written with its audit entry (``firewall.set``,
``firewall.unset``) and announced through ``on_change``: the leader sends every
connected agent its ``Firewall`` message again and each loads its table at once, the
agent on a control plane's own machine included. No control plane or agent restarts.

A standby reads the same document when its copy of the store changes, so the leader
it may become pushes what was set.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import replace

from llmgw.config import FirewallConfig
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import FirewallSet
from llmgw.server.store import Store
from llmgw.wire.admin import FirewallChangeJson, FirewallJson

SETTING = "firewall"
HISTORY_ACTIONS = ("firewall.set", "firewall.unset")


def checked_network(value: str) -> str:
    """A network as the agents' tables take it (an address is its /32 or /128), or a
    Refusal naming it: host bits under the prefix are refused there too, since quietly
    letting in the whole network would be worse than the slip."""
    try:
        return str(ipaddress.ip_network(value.strip(), strict=True))
    except ValueError as exc:
        raise Refusal(
            400,
            "bad_request",
            f"networks: {value!r} is not a network like 10.0.0.0/8 or fd00::/8 ({exc})",
            "networks",
        ) from None


class FleetFirewall:
    def __init__(
        self, store: Store, configured: FirewallConfig, on_change: Callable[[], None]
    ) -> None:
        """``configured``: server.yaml's (checked when it was read); ``on_change``: after
        every change (every agent is sent its firewall again)."""
        self.store = store
        self.base = configured
        # Set at run time, over the base: "enabled" and "networks", each when set.
        self.overrides: dict[str, object] = {}
        # Bumped by every change.
        self.version = 0
        self.on_change = on_change

    async def load(self) -> None:
        raw = await self.store.get_setting(SETTING)
        doc = json.loads(raw) if raw else {}
        overrides: dict[str, object] = {}
        if isinstance(doc.get("enabled"), bool):
            overrides["enabled"] = doc["enabled"]
        networks = doc.get("networks")
        if isinstance(networks, list) and all(isinstance(n, str) for n in networks):
            overrides["networks"] = list(networks)
        self.overrides = overrides
        self.version = int(doc.get("version") or 0)

    @property
    def current(self) -> FirewallConfig:
        """The firewall every agent is sent: server.yaml's with what was set over it."""
        enabled = self.overrides.get("enabled", self.base.enabled)
        networks = self.overrides.get("networks", self.base.networks)
        assert isinstance(enabled, bool) and isinstance(networks, list)
        return replace(self.base, enabled=enabled, networks=[str(n) for n in networks])

    def document(self) -> FirewallJson:
        now = self.current
        return {
            "version": self.version,
            "enabled": now.enabled,
            "networks": list(now.networks),
            "source": {
                part: "ctl" if part in self.overrides else "server.yaml"
                for part in ("enabled", "networks")
            },
        }

    async def ask(self, ask: FirewallSet, by: Principal) -> FirewallJson:
        """``ctl firewall set|unset``: turn it on or off, name the networks, or (unset)
        go back to server.yaml's; a Refusal naming the field when it is bad. Nothing
        changes when it is refused."""
        overrides = dict(self.overrides)
        if ask.unset:
            if ask.enabled is not None or ask.networks is not None:
                raise Refusal(
                    400,
                    "bad_request",
                    "unset: give it alone; it goes back to server.yaml's firewall",
                    "unset",
                )
            overrides = {}
            action, shown = "firewall.unset", "back to server.yaml"
        else:
            if ask.enabled is None and ask.networks is None:
                raise Refusal(
                    400, "bad_request", "give enabled, networks or both (or unset)", "enabled"
                )
            said: list[str] = []
            if ask.enabled is not None:
                overrides["enabled"] = ask.enabled
                said.append(f"enabled = {json.dumps(ask.enabled)}")
            if ask.networks is not None:
                networks = [checked_network(n) for n in ask.networks]
                overrides["networks"] = networks
                said.append(f"networks = {json.dumps(networks)}")
            action, shown = "firewall.set", ", ".join(said)
        version = self.version + 1
        doc = {**overrides, "version": version}
        await self.store.put_setting(SETTING, json.dumps(doc, sort_keys=True))
        await self.store.audit(by.name, action, SETTING, shown)
        self.overrides, self.version = overrides, version
        self.on_change()
        return self.document()

    async def history(self, limit: int = 200) -> list[FirewallChangeJson]:
        """The changes, newest first: when, who and what."""
        rows = await self.store.audit_log(limit=5000)
        changes: list[FirewallChangeJson] = [
            {"at": r["at"], "actor": r["actor"], "action": r["action"], "change": r["detail"]}
            for r in rows
            if r.get("action") in HISTORY_ACTIONS
        ]
        return changes[:limit]
