"""The fleet's multi-node NVLink domains (GB200 NVL72 racks and the like), from the cards'
fabric figures the agents send with their slow figures (``GpuHealth.fabric_*``) and
whether IMEX runs on each node (``NodeVitals.imex_*``).

A domain is the cards with the same ClusterUUID and CliqueId; it is drawn as a rack of
trays, each node a tray. A card is *joined* when its fabric state is Completed and its
status Success. An all-zero ClusterUUID is a single node's own NVSwitch fabric (an HGX
board): that is no multi-node domain, and a card in it that is Completed/Success has
nothing to join. A card with a fabric state but no ids (or an all-zero ClusterUUID while
not Completed/Success) is *unjoined*; it is drawn in its node's tray too when the node's
other cards are in one domain. A card without any fabric state (a PCIe card: N/A) is
no part of this.

Problems are said with their fix: a card of a domain that has not joined it (or whose
fabric health is not Healthy), a tray of a domain spanning several nodes where IMEX is not
running, and a node whose cards are in two cliques.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from llmgw.metricstext import ZERO_UUID, card_joined
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.hardware import GpuHealth

_SHOWN = 8  # places named in one problem; the rest are counted

_JOIN_FIX = (
    "read the card's Fabric block (`nvidia-smi -q -i {index}`); check the NVLink switch "
    "trays' fabric manager (NMX) for this tray and its partition, then reset the card "
    "(`nvidia-smi -r -i {index}`) or reboot the tray"
)
_IMEX_FIX = (
    "start it (`systemctl enable --now nvidia-imex`) and list every tray of the domain in "
    "/etc/nvidia-imex/nodes_config.cfg; its log is /var/log/nvidia-imex.log"
)


class CardJson(TypedDict):
    """A card of a domain (or one with a fabric but no domain) as the API shows it."""

    index: int
    uuid: str
    state: str | None
    status: str | None
    # None: its fabric was not read (never shown as "not joined").
    joined: bool | None
    health: dict[str, str] | None


class UnjoinedJson(CardJson):
    node: str


class ImexJson(TypedDict):
    running: bool | None
    channels: int | None


class TrayJson(TypedDict):
    node: str
    connected: bool
    cards: list[CardJson]
    imex: ImexJson


class DomainJson(TypedDict):
    id: str
    cluster_uuid: str
    clique_id: int
    nodes: int
    cards: int
    joined: int
    trays: list[TrayJson]
    problems: list[str]


class DomainsJson(TypedDict):
    """``GET /api/v1/nvlink``."""

    domains: list[DomainJson]
    unjoined: list[UnjoinedJson]


def _key(h: GpuHealth) -> tuple[str, int] | None:
    uuid, clique = h.fabric_cluster_uuid, h.fabric_clique_id
    if uuid is None or uuid == ZERO_UUID or clique is None:
        return None
    return uuid, clique


def _completed(h: GpuHealth) -> bool:
    return h.fabric_state == "Completed" and h.fabric_status == "Success"


def _card_json(h: GpuHealth) -> CardJson:
    return {
        "index": h.index,
        "uuid": h.uuid,
        "state": h.fabric_state,
        "status": h.fabric_status,
        "joined": card_joined(h),
        "health": h.fabric_health,
    }


@dataclass
class _Tray:
    node: str
    connected: bool
    imex: ImexJson
    cards: list[GpuHealth] = field(default_factory=list)

    def as_json(self) -> TrayJson:
        cards = sorted(self.cards, key=lambda h: h.index)
        return {
            "node": self.node,
            "connected": self.connected,
            "cards": [_card_json(h) for h in cards],
            "imex": self.imex.copy(),
        }


@dataclass
class _Domain:
    cluster_uuid: str
    clique_id: int
    trays: dict[str, _Tray] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.cluster_uuid}/{self.clique_id}"

    def as_json(self) -> DomainJson:
        trays = [self.trays[n] for n in sorted(self.trays)]
        cards = [h for t in trays for h in t.cards]
        return {
            "id": self.id,
            "cluster_uuid": self.cluster_uuid,
            "clique_id": self.clique_id,
            "nodes": len(trays),
            "cards": len(cards),
            "joined": sum(1 for h in cards if card_joined(h)),
            "trays": [t.as_json() for t in trays],
            "problems": list(self.problems),
        }


def _imex(view: NodeView) -> ImexJson:
    vitals = view.live.vitals
    if vitals is None:
        return {"running": None, "channels": None}
    return {"running": vitals.imex_running, "channels": vitals.imex_channels}


def _named(places: list[str]) -> str:
    shown = ", ".join(places[:_SHOWN])
    more = len(places) - _SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _where(node: str, h: GpuHealth) -> str:
    return f"{node} card {h.index}"


def _judge(domain: _Domain, split: dict[str, list[str]]) -> None:
    trays = [domain.trays[n] for n in sorted(domain.trays)]
    out = domain.problems
    for tray in trays:
        for h in tray.cards:
            if card_joined(h) is not False:
                continue  # joined, or not read: nothing to say of it
            said = f"fabric state {h.fabric_state}"
            if h.fabric_status is not None:
                said += f", status {h.fabric_status}"
            if _key(h) is None:
                said += ", no ClusterUUID/CliqueId"
            out.append(
                f"{_where(tray.node, h)} has not joined NVLink domain {domain.id} ({said}). "
                f"Fix: {_JOIN_FIX.format(index=h.index)}"
            )
    unhealthy = [
        f"{_where(t.node, h)} ({h.fabric_health.get('summary')})"
        for t in trays
        for h in t.cards
        if card_joined(h)
        and h.fabric_health is not None
        and h.fabric_health.get("summary") not in (None, "Healthy")
    ]
    if unhealthy:
        out.append(
            f"fabric health is not Healthy on {_named(unhealthy)}: the card joined but its "
            "NVLink routes or bandwidth are degraded. Fix: read the Fabric Health block "
            "(`nvidia-smi -q -i INDEX`) and the switch trays' NMX alarms; drain the node "
            "if the bandwidth stays Degraded"
        )
    if len(trays) > 1:
        stopped = [t.node for t in trays if t.imex["running"] is False]
        unseen = [t.node for t in trays if t.imex["running"] is None]
        if stopped:
            out.append(
                f"IMEX is not running on {_named(stopped)}, in a domain of {len(trays)} "
                "nodes: jobs spanning trays cannot share memory over NVLink there. "
                f"Fix: {_IMEX_FIX}"
            )
        if unseen:
            out.append(
                f"no IMEX was seen on {_named(unseen)}, in a domain of {len(trays)} nodes "
                "(not installed, or the agent cannot see the host's processes). "
                f"Fix: install nvidia-imex, then {_IMEX_FIX}"
            )
    for node, domains in sorted(split.items()):
        if domain.id in domains:
            out.append(
                f"{node}'s cards are in {len(domains)} NVLink cliques ({', '.join(domains)}): "
                "a tray's cards belong to one. Fix: check the tray's NVLink cabling and its "
                "partition in the switch trays' NMX, then reboot the tray"
            )


def domains(views: Iterable[NodeView]) -> DomainsJson:
    """``GET /api/v1/nvlink``: the NVLink domains as racks of trays, with their problems,
    and the cards that have a fabric but no domain."""
    found: dict[tuple[str, int], _Domain] = {}
    unjoined: list[UnjoinedJson] = []
    split: dict[str, list[str]] = {}
    for view in sorted(views, key=lambda v: v.id):
        imex = _imex(view)
        connected = view.session is not None
        mine: dict[tuple[str, int], _Tray] = {}
        loose: list[GpuHealth] = []
        for h in view.live.gpu_health or ():
            key = _key(h)
            if key is not None:
                domain = found.setdefault(key, _Domain(*key))
                tray = mine.get(key)
                if tray is None:
                    tray = mine[key] = domain.trays[view.id] = _Tray(view.id, connected, imex)
                tray.cards.append(h)
            elif card_joined(h) is not None:
                loose.append(h)
        if len(mine) > 1:
            split[view.id] = sorted(f"{u}/{c}" for u, c in mine)
        for h in loose:
            unjoined.append({"node": view.id, **_card_json(h)})
            if len(mine) == 1:
                next(iter(mine.values())).cards.append(h)
    out = sorted(found.values(), key=lambda d: d.id)
    for domain in out:
        _judge(domain, split)
    return {"domains": [d.as_json() for d in out], "unjoined": unjoined}
