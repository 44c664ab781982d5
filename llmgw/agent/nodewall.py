"""The cluster's ``Firewall`` message made this node's table: the plan kept in the state
dir (``llmgw firewall status|sync`` read it there) and loaded with nft when the agent
runs as root. An agent that is not root keeps no table and says so; nothing it is sent
is refused for that.

The control planes are named by their agent addresses, which may be host names: they
are resolved here, once per message, since nftables takes addresses. The agent port's
rule is kept only on a node that is itself one of the control planes' machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from dataclasses import replace
from pathlib import Path

import psutil

from llmgw.agent.ephemeral import PROC, overlap, read_ephemeral
from llmgw.agent.firewall import (
    ROOT_NOTE,
    FirewallError,
    FirewallPlan,
    Nft,
    available,
    save_plan,
)
from llmgw.wire.messages import Firewall

log = logging.getLogger("llmgw.agent.firewall")


def addresses_of(names: list[str]) -> tuple[str, ...]:
    """Each name's addresses (an address stands for itself); names that do not resolve
    are left out, and said in the log."""
    found: list[str] = []
    for name in names:
        try:
            address = ipaddress.ip_address(name.split("%", 1)[0])
        except ValueError:
            pass
        else:
            mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:10.0.0.5 is 10.0.0.5
            found.append(str(mapped or address))
            continue
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except OSError as exc:
            log.warning("control plane %s does not resolve (%s): left out of the table", name, exc)
            continue
        found.extend(str(info[4][0]) for info in infos)
    return tuple(dict.fromkeys(found))


def own_addresses() -> set[str]:
    mine: set[str] = set()
    with contextlib.suppress(OSError):
        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    mine.add(entry.address.split("%", 1)[0])
    return mine


def plan_of(msg: Firewall) -> FirewallPlan:
    planes = addresses_of(msg.control_planes)
    # Loopback control planes (one machine) need no rule: lo is always let through.
    planes = tuple(a for a in planes if not ipaddress.ip_address(a).is_loopback)
    here = bool(own_addresses() & set(planes)) or not planes
    return FirewallPlan(
        enabled=msg.enabled,
        networks=tuple(msg.networks),
        control_planes=planes,
        engine_ports=msg.engine_ports,
        agent_port=msg.agent_port if here and msg.networks else None,
    )


class NodeFirewall:
    def __init__(self, state_dir: Path, nft: Nft | None = None, proc: Path = PROC) -> None:
        self.state_dir = state_dir
        self.nft = nft or Nft()
        # Where the kernel's ephemeral port sysctls are read (``ephemeral``).
        self.proc = proc
        # Why the table is not as the cluster wants it, in words; None when it is.
        self.problem: str | None = None
        self.plan: FirewallPlan | None = None
        self._asked: FirewallPlan | None = None
        # Ports of replicas spanning nodes and the member nodes let in to each.
        self._peers: dict[int, tuple[str, ...]] = {}
        # The member nodes of replicas whose ranks meet over NCCL and gloo: let in to
        # the part of the engine ports the kernel may pick for those.
        self._collective: tuple[str, ...] = ()
        # The agent's own metrics port and who may reach it (agent.yaml's
        # metrics_listen and metrics_scrapers); None: it serves no metrics.
        self.metrics_port: int | None = None
        self.metrics_scrapers: tuple[str, ...] = ()

    async def keep(self, msg: Firewall) -> None:
        try:
            self._asked = await asyncio.to_thread(plan_of, msg)
        except FirewallError as exc:
            self.problem = f"the cluster's firewall settings cannot be used: {exc}"
            log.warning("%s", self.problem)
            return
        await self._apply()

    async def peers(
        self, peers: dict[int, tuple[str, ...]], collective: tuple[str, ...] = ()
    ) -> None:
        """The shards' peers changed (a replica spanning nodes started or stopped):
        ``peers`` by the port they reach, ``collective`` the member nodes of replicas
        whose ranks listen on ports the kernel picks (NCCL, gloo)."""
        if (peers, collective) == (self._peers, self._collective):
            return
        self._peers, self._collective = dict(peers), tuple(collective)
        if self._asked is not None:
            await self._apply()

    async def _apply(self) -> None:
        asked = self._asked
        assert asked is not None
        first, last = (int(x) for x in asked.engine_ports.split("-"))
        ranges: dict[tuple[int, int], tuple[str, ...]] = {}
        if self._collective:
            local, reserved = await asyncio.to_thread(read_ephemeral, self.proc)
            ranges = {r: self._collective for r in overlap((first, last), local, reserved)}
        try:
            plan = replace(
                asked,
                peers={p: a for p, a in self._peers.items() if first <= p <= last},
                peer_ranges=ranges,
                metrics_port=self.metrics_port,
                metrics_scrapers=self.metrics_scrapers,
            )
        except FirewallError as exc:
            self.problem = f"a replica's peers cannot be let in: {exc}"
            log.warning("%s", self.problem)
            return
        if plan == self.plan:
            return
        self.plan = plan
        with contextlib.suppress(OSError):
            save_plan(self.state_dir, plan)
        if not available():
            self.problem = None if not plan.enabled else f"no table kept: {ROOT_NOTE}"
            return
        try:
            await asyncio.to_thread(self.nft.apply, plan)
        except FirewallError as exc:
            self.problem = str(exc)
            log.warning("firewall: %s", exc)
            return
        self.problem = None
        log.info(
            "firewall: %s",
            "llmgw's table loaded" if plan.enabled else "llmgw's table removed (turned off)",
        )
