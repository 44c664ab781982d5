"""A recorded 64-node fleet: two InfiniBand fabrics and one GB200 NVL72 NVLink domain, as
the control plane holds it after every agent has registered and sent a heartbeat. Made
in code, deterministically (the same GUIDs, UUIDs and LIDs every run), for the fabric
and NVLink tests of the API, the console and the admin pages, and for placement tests.

Nodes (each id is also the host name the adapters' node descriptions carry)
--------------------------------------------------------------------------------------

================  =====  =========================================  ===================
nodes             count  cards                                      network
================  =====  =========================================  ===================
``nvl-01..18``    18     4x NVIDIA GB200 (189471 MiB), aarch64,     NVLink domain
                         2 Grace (144 CPUs), 884 GiB                ``NVLINK_DOMAIN``
``a-01..a-16``    16     8x NVIDIA H100 80GB HBM3 (81559 MiB),      fabric A, SU1
                         x86_64, 224 CPUs, 2 TiB
``a-17..a-30``    14     the same                                   fabric A, SU2
``b-01..b-16``    16     the same                                   fabric B
================  =====  =========================================  ===================

Every node is connected (a fake agent session), Ready, with facts (``HostFacts``: CPU
count, memory, disks, cards with uuid/index/name/memory) and one heartbeat's live data
(cards, ``gpu_health``, ``vitals``, ``ib_ports``), each message encoded and decoded as
on the wire and taken through ``NodeRegistry.heartbeat``, so the shapes are the agents'.
Every node has the engine ``vllm`` installed.

InfiniBand (H100 nodes only)
----------------------------
Each H100 node has 8 ConnectX-7 NDR ports, ``mlx5_0..mlx5_7``, port 1 each, 400 Gb/s
(``4X NDR``). Both fabrics are rail-optimised: adapter ``mlx5_N`` of every host of a
scalable unit (SU) is on that SU's rail-N leaf, and every leaf is cabled to every spine.
Switches are Quantum-2 (MQM9700, 65 ports, devid 0xd2f2); they are named
``<fabric>-spine-<k>`` and ``<fabric>-su<s>-rail<N>`` (``switch_name`` gives these).

* Fabric A, id ``FABRIC_A`` (its master SM, the SM on ``a-spine-1``; the standby
  ``FABRIC_A_STANDBY`` is on ``a-spine-2``, known through ``saquery SMIR``): 4 spines,
  16 leaves: ``a-su1-rail0..7`` carry ``a-01..a-16`` (host n on leaf port n),
  ``a-su2-rail0..7`` carry ``a-17..a-30`` (host 16+n on leaf port n). Each leaf has two
  cables to each spine (leaf ports 33..40). Two hosts of one SU share 8 leaves
  (``hops`` 0); a host of SU1 and one of SU2 are 2 hops apart, through a spine.
* Fabric B, id ``FABRIC_B`` (the SM on ``b-spine-1``; no standby): 2 spines, 8 leaves
  ``b-su1-rail0..7`` carrying ``b-01..b-16``, four cables from each leaf to each spine.

The GB200 trays have no InfiniBand: they report an empty ``ib_ports`` list (what the
agent sends where ``/sys/class/infiniband`` is absent). A real NVL72 rack does carry
east-west NICs, but cabling them into fabric A or B would make those fabrics' node sets
mix two kinds of nodes; keeping the trays off InfiniBand keeps "fabric" and "NVLink
domain" two separate, checkable questions (the placement tests ask both).

NVLink
------
All 72 GB200 cards report fabric state Completed, status Success, one ClusterUUID
(``CLUSTER_UUID``) and one CliqueId (``CLIQUE_ID``), health Healthy/Full; every tray runs
IMEX with one channel. The H100 boards report their own NVSwitch fabric (an all-zero
ClusterUUID, clique 0, as 580 drivers write it), which is no multi-node domain.

Problems (``problems=True``, the default; ``problems=False`` gives the same fleet
without them, every cable and port healthy, and a standby SM on B too)
--------------------------------------------------------------------------------------
* ``INIT_PORT``: ``a-23 mlx5_5`` is in INIT (physically LinkUp, its LID and SM known):
  FabricWatch says "1 port(s) in INIT or ARMED".
* ``DEGRADED_CABLE``: ``a-07 mlx5_3`` trained at 4x HDR (200 Gb/s) on an NDR leaf:
  the port reports 200 Gb/s and the map has the degraded cable ("trained at HDR, below
  the NDR of both ends").
* ``UNJOINED_CARD``: ``nvl-13`` card 2 is still "In Progress" (no ClusterUUID/CliqueId
  yet): the domain has 72 cards, 71 joined, and the card is listed as unjoined. Code
  that treats a tray with a card out of the domain as off NVLink (``fleet/wiring.py``
  does) sees 17 usable trays (68 cards); ``problems=False`` gives all 18 (72 cards).
* Fabric B has one SM and no standby: ``FabricMaps.problems`` says so once its SMIR is
  read.

Interface
---------
* ``views(problems=True) -> dict[str, NodeView]``: the 64 nodes by id, sorted.
* ``registry(fleet=None, problems=True) -> NodeRegistry``: a registry holding them (no
  store: ``flush``/``enrolled`` must not be called), what the API routes and pages take.
* ``ibnetdiscover_text("a"|"b", problems=True) -> str``: the fabric's ``ibnetdiscover``
  output (the topology format, as the tool prints it). Copies are in
  ``tests/fixtures/fleet64/`` (``fixture_files``; a test keeps them equal to this;
  ``write_fixtures()`` writes them again), for stand-in tools in end-to-end tests.
* ``saquery_smir_text("a"|"b", problems=True) -> str`` and ``smir(...)``: ``saquery
  SMIR`` output and the records the agent parses from it.
* ``topologies(problems=True) -> dict[str, Topology]``: both maps parsed, keyed by
  fabric id (``FABRIC_A``, ``FABRIC_B``: what ``FabricWatch`` reports).
* ``fabric_maps(fleet=None, problems=True, clock=clock) -> FabricMaps``: the maps as the
  control plane keeps them after one pass (read at ``MAP_READ_AT`` by ``a-01`` and
  ``b-01``, with their SMIR), with its ``watch`` and ``registry``; ``clock`` reads
  ``MAP_READ_AT + MAP_AGE``. ``await maps.poll()`` on a fresh ``FabricMaps`` over
  ``registry()`` gives the same maps: the fake agents answer ``fabric.discover``.
* ``switches(fabric) -> list[Switch]`` (name, guid, lid, tier, su, rail, hosts),
  ``hca_guid(host, rail)``, ``hca_lid(host, rail)``: the layout, for asserting on it.
* ``AgentSession``: each view's ``session``; ``.asked`` lists what it was asked.
* Names: ``NODES``, ``TRAYS``, ``A_SU1``, ``A_SU2``, ``A_NODES``, ``B_NODES``,
  ``H100_NODES``, ``ADAPTERS``; ``FABRIC_A``/``FABRIC_B`` (and ``FABRIC_IDS`` by letter),
  ``FABRIC_A_STANDBY``; ``CLUSTER_UUID``, ``CLIQUE_ID``, ``NVLINK_DOMAIN`` (the domain
  id ``nvlink.domains`` gives); ``INIT_PORT``, ``DEGRADED_CABLE``, ``UNJOINED_CARD``;
  ``GB200_MEMORY``, ``H100_MEMORY`` (bytes per card).

Each call builds new objects: a test may change what it gets (cordon a node, stop a
tray's IMEX) without touching another test's fleet.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast

from llmgw.agent.discovery.ibwatch import parse_smir
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.ibtopology import Topology, parse_ibnetdiscover
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.store import Store
from llmgw.wire import GPU, Disk, Heartbeat, HostFacts, Register
from llmgw.wire.framing import FrameDecoder
from llmgw.wire.hardware import GpuHealth, IbPort, NodeVitals
from llmgw.wire.messages import EngineInfo, Message, Response, decode_message, encode_message
from llmgw.wire.states import NodeState
from tests.support import wiring

MiB = 2**20
GiB = 2**30
TiB = 2**40

# --- the nodes ------------------------------------------------------------------------

TRAYS = tuple(f"nvl-{n:02d}" for n in range(1, 19))
A_SU1 = tuple(f"a-{n:02d}" for n in range(1, 17))
A_SU2 = tuple(f"a-{n:02d}" for n in range(17, 31))
A_NODES = A_SU1 + A_SU2
B_NODES = tuple(f"b-{n:02d}" for n in range(1, 17))
H100_NODES = A_NODES + B_NODES
NODES = tuple(sorted(TRAYS + H100_NODES))
FABRIC_NODES: dict[str, tuple[str, ...]] = {"a": A_NODES, "b": B_NODES}

RAILS = 8
ADAPTERS = tuple(f"mlx5_{r}" for r in range(RAILS))
GB200_CARDS = 4
H100_CARDS = 8
GB200_MEMORY = 189471 * MiB  # fb_memory_usage/total of nvidia-smi -q -x
H100_MEMORY = 81559 * MiB
GB200_NAME = "NVIDIA GB200"
H100_NAME = "NVIDIA H100 80GB HBM3"
TRAY_CPUS, TRAY_MEMORY = 144, 884 * GiB
H100_CPUS, H100_MEMORY_TOTAL = 224, 2 * TiB
ENGINE = "vllm"
FEATURES_IB = ["heartbeat.v1", "ibnetdiscover", "ib_write_bw"]
FEATURES_TRAY = ["heartbeat.v1"]

# --- problems -------------------------------------------------------------------------

INIT_PORT = ("a-23", "mlx5_5")
DEGRADED_CABLE = ("a-07", "mlx5_3")
UNJOINED_CARD = ("nvl-13", 2)

# --- NVLink ---------------------------------------------------------------------------

CLUSTER_UUID = "3b6f0c9e-5a1d-4c27-9e84-7f2a1d0b6c53"
CLIQUE_ID = 2
NVLINK_DOMAIN = f"{CLUSTER_UUID}/{CLIQUE_ID}"
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_UUIDS = uuid.UUID("8d0f6b0e-4c8a-4f51-9a55-0b1e6c640064")

# --- InfiniBand -----------------------------------------------------------------------

SWITCH_DEVID, HCA_DEVID = "0xd2f2", "0x1021"  # Quantum-2 MQM9700, ConnectX-7
SPINES: dict[str, int] = {"a": 4, "b": 2}
# Scalable units per fabric: (su number, its hosts).
SUS: dict[str, tuple[tuple[int, tuple[str, ...]], ...]] = {
    "a": ((1, A_SU1), (2, A_SU2)),
    "b": ((1, B_NODES),),
}
UPLINK_PORT = 33  # a leaf's first cable to a spine; hosts are on ports 1..16


def switch_guid(fabric: str, tier: Literal["spine", "leaf"], su: int, index: int) -> str:
    """``0xb0cf0e0300`` + fabric letter + ``5`` (spine) or ``1`` (leaf) + SU + index."""
    return f"0xb0cf0e0300{fabric}{5 if tier == 'spine' else 1}{su:02x}{index:02x}"


def hca_guid(host: str, rail: int) -> str:
    """The node (and port) GUID of ``host``'s ``mlx5_<rail>``: ``0x946dae0300`` + fabric
    letter + ``0`` + host number + rail."""
    return f"0x946dae0300{host[0]}0{int(host[2:]):02x}{rail:02x}"


FABRIC_A = switch_guid("a", "spine", 0, 1)  # the master SM: a-spine-1
FABRIC_A_STANDBY = switch_guid("a", "spine", 0, 2)
FABRIC_B = switch_guid("b", "spine", 0, 1)
FABRIC_B_STANDBY = switch_guid("b", "spine", 0, 2)  # only with problems=False
FABRIC_IDS: dict[str, str] = {"a": FABRIC_A, "b": FABRIC_B}
MASTER_LID = 1  # the master SM's switch is each fabric's LID 1

# The maps' time: read by the control plane at MAP_READ_AT, looked at MAP_AGE later.
MAP_READ_AT = 1_760_000_000.0
MAP_AGE = 120.0


def clock() -> float:
    return MAP_READ_AT + MAP_AGE


@dataclass(frozen=True)
class Switch:
    fabric: str
    name: str  # "a-spine-1", "a-su1-rail0"
    guid: str
    lid: int
    tier: Literal["spine", "leaf"]
    su: int | None = None  # a leaf's scalable unit
    rail: int | None = None  # a leaf's adapter number
    hosts: tuple[str, ...] = ()  # a leaf's hosts, on leaf ports 1, 2, ...

    @property
    def description(self) -> str:
        return f"MF0;{self.name}:MQM9700/U1"


def switches(fabric: str) -> list[Switch]:
    """The fabric's spines (lids 1..), then its leaves, SU by SU and rail by rail."""
    out = [
        Switch(fabric, f"{fabric}-spine-{k}", switch_guid(fabric, "spine", 0, k), k, "spine")
        for k in range(1, SPINES[fabric] + 1)
    ]
    lid = len(out)
    for su, hosts in SUS[fabric]:
        for rail in range(RAILS):
            lid += 1
            guid = switch_guid(fabric, "leaf", su, rail)
            name = f"{fabric}-su{su}-rail{rail}"
            out.append(Switch(fabric, name, guid, lid, "leaf", su, rail, hosts))
    return out


def hca_lid(host: str, rail: int) -> int:
    """LIDs of the adapters start at 101: host n's mlx5_r is 101 + 8 (n - 1) + r."""
    return 101 + RAILS * (int(host[2:]) - 1) + rail


def fabric_of(host: str) -> str | None:
    return host[0] if host in H100_NODES else None


def _speed(host: str, rail: int, problems: bool) -> tuple[str, float]:
    """The trained width and speed of a host cable (ibnetdiscover's words) and its rate."""
    if problems and (host, f"mlx5_{rail}") == DEGRADED_CABLE:
        return "4xHDR", 200.0
    return "4xNDR", 400.0


# --- ibnetdiscover and saquery text -----------------------------------------------------


def _hex(guid: str) -> str:
    return guid.removeprefix("0x")


def _uplinks(fabric: str) -> list[tuple[Switch, int, Switch, int]]:
    """(leaf, leaf port, spine, spine port) of every leaf-spine cable."""
    all_switches = switches(fabric)
    spines = [s for s in all_switches if s.tier == "spine"]
    leaves = [s for s in all_switches if s.tier == "leaf"]
    per = 8 // len(spines)  # cables from each leaf to each spine: 8 uplinks a leaf
    out = []
    for j, leaf in enumerate(leaves):
        for k, spine in enumerate(spines):
            for c in range(per):
                out.append((leaf, UPLINK_PORT + per * k + c, spine, per * j + c + 1))
    return out


@cache
def ibnetdiscover_text(fabric: str, *, problems: bool = True) -> str:
    """``ibnetdiscover`` over the fabric, from ``<first host> mlx5_0``: switches (spines,
    then leaves), then every adapter, each cable listed from both of its ends."""
    if fabric not in FABRIC_NODES:
        raise ValueError(f"fabric {fabric!r}: the fleet has fabrics 'a' and 'b'")
    all_switches = switches(fabric)
    by_guid = {s.guid: s for s in all_switches}
    first = _hex(hca_guid(FABRIC_NODES[fabric][0], 0))
    lines = [
        "#",
        "# Topology file: generated on Mon Oct  6 09:20:14 2025",
        "#",
        f"# Initiated from node {first} port {first}",
        "",
    ]
    # switch guid -> [(its port, the line)]
    ports: dict[str, list[tuple[int, str]]] = {s.guid: [] for s in all_switches}
    for leaf, lport, spine, sport in _uplinks(fabric):
        ports[spine.guid].append(
            (
                sport,
                f'[{sport}]\t"S-{_hex(leaf.guid)}"[{lport}]\t\t# "{leaf.description}" '
                f"lid {leaf.lid} 4xNDR",
            )  # fmt: skip
        )
        ports[leaf.guid].append(
            (
                lport,
                f'[{lport}]\t"S-{_hex(spine.guid)}"[{sport}]\t\t# "{spine.description}" '
                f"lid {spine.lid} 4xNDR",
            )  # fmt: skip
        )
    cas: list[str] = []
    for leaf in (s for s in all_switches if s.tier == "leaf"):
        assert leaf.rail is not None
        for n, host in enumerate(leaf.hosts, 1):
            guid, lid = _hex(hca_guid(host, leaf.rail)), hca_lid(host, leaf.rail)
            link, _ = _speed(host, leaf.rail, problems)
            desc = f"{host} mlx5_{leaf.rail}"
            ports[leaf.guid].append(
                (n, f'[{n}]\t"H-{guid}"[1]({guid}) \t\t# "{desc}" lid {lid} {link}')
            )
            cas += [
                "vendid=0x2c9",
                f"devid={HCA_DEVID}",
                f"sysimgguid=0x{guid}",
                f"caguid=0x{guid}",
                f'Ca\t1 "H-{guid}"\t\t# "{desc}"',
                f'[1]({guid}) \t"S-{_hex(leaf.guid)}"[{n}]\t\t# lid {lid} lmc 0 '
                f'"{leaf.description}" lid {leaf.lid} {link}',
                "",
            ]
    for guid, listed in ports.items():
        s = by_guid[guid]
        kind = "enhanced" if s.tier == "spine" else "base"
        lines += [
            "vendid=0x2c9",
            f"devid={SWITCH_DEVID}",
            f"sysimgguid={guid}",
            f"switchguid={guid}({_hex(guid)})",
            f'Switch\t65 "S-{_hex(guid)}"\t\t# "{s.description}" {kind} port 0 lid {s.lid} lmc 0',
            *(line for _, line in sorted(listed)),
            "",
        ]
    return "\n".join(lines + cas)


def saquery_smir_text(fabric: str, *, problems: bool = True) -> str:
    """``saquery SMIR`` on the fabric: its master SM, and the standby where there is one
    (fabric A always; fabric B only with ``problems=False``)."""
    records = [(FABRIC_IDS[fabric], MASTER_LID, 15, 3, 482113 if fabric == "a" else 377019)]
    if fabric == "a" or not problems:
        records.append((switch_guid(fabric, "spine", 0, 2), 2, 14, 2, 90211))
    out = []
    for guid, lid, priority, state, activity in records:
        out += [
            "SMInfoRecord dump:",
            "\t\tRID",
            f"\t\tLID...................{lid}",
            "\t\tSMInfo dump:",
            f"\t\tGUID..................{guid}",
            "\t\tSM_Key................0x0000000000000000",
            f"\t\tActCount..............{activity}",
            f"\t\tPriority..............{priority}",
            f"\t\tSMState...............{state}",
        ]
    return "\n".join(out) + "\n"


def smir(fabric: str, *, problems: bool = True) -> list[dict[str, Any]]:
    """The SM records an agent sends with the map (``parse_smir`` of the SMIR text)."""
    return parse_smir(saquery_smir_text(fabric, problems=problems))


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fleet64"


def fixture_files() -> dict[Path, str]:
    """The generated copies under ``tests/fixtures/fleet64`` and what each must hold."""
    out: dict[Path, str] = {}
    for f in ("a", "b"):
        out[FIXTURES / f"ibnetdiscover_fabric-{f}_NDR-rails_fleet64.txt"] = ibnetdiscover_text(f)
        out[FIXTURES / f"saquery-SMIR_fabric-{f}_fleet64.txt"] = saquery_smir_text(f)
    return out


def write_fixtures() -> None:
    """Write the copies again, after a change to this module."""
    for path, text in fixture_files().items():
        path.write_text(text)


def topologies(*, problems: bool = True) -> dict[str, Topology]:
    """Both fabrics' maps, parsed by the control plane's own parser, by fabric id."""
    return {
        FABRIC_IDS[f]: parse_ibnetdiscover(ibnetdiscover_text(f, problems=problems))
        for f in ("a", "b")
    }


# --- the agents ----------------------------------------------------------------------


class AgentSession:
    """A connected agent's stream, faked: it sends nothing anywhere, remembers what the
    control plane sent and asked, and answers ``fabric.discover`` as a node with
    ``ibnetdiscover`` and ``saquery`` answers it (the map of the fabric its asked port
    is on, with the SMIR records)."""

    def __init__(self, node_id: str, problems: bool = True) -> None:
        self.node_id = node_id
        self.problems = problems
        self.sent: list[Message] = []
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.closed: str | None = None

    def close(self, reason: str) -> None:
        self.closed = reason

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        self.asked.append((kind, dict(args)))
        fabric = fabric_of(self.node_id)
        if kind != "fabric.discover":
            yield Response(id=kind, ok=False, error=f"this agent does not answer {kind!r}")
        elif fabric is None or args.get("device") not in ADAPTERS:
            error = f"ibnetdiscover failed (exit 255): can't open UMAD port ({args.get('device')})"
            yield Response(id=kind, ok=False, error=error)
        else:
            text = ibnetdiscover_text(fabric, problems=self.problems)
            records = smir(fabric, problems=self.problems)
            yield Response(id=kind, result={"text": text, "smir": records})


def _uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_UUIDS, f'{node}/{index}')}"


def _gpus(node: str) -> list[GPU]:
    tray = node in TRAYS
    count = GB200_CARDS if tray else H100_CARDS
    return [
        GPU(
            index=i,
            uuid=_uuid(node, i),
            name=GB200_NAME if tray else H100_NAME,
            memory_total=GB200_MEMORY if tray else H100_MEMORY,
            memory_used=0,
            utilization=0,
            compute_capability="10.0" if tray else "9.0",
            driver="580.173.02" if tray else "580.105.08",
            bus_id=f"00000000:{(0x08, 0x29, 0x18, 0x39)[i] if tray else 0x18 + 0x10 * i:02x}:00.0",
            temperature=31 + i,
            power=(142.5 if tray else 71.3) + i,
            power_limit=1200.0 if tray else 700.0,
            pstate="P0",
        )
        for i in range(count)
    ]


def _facts(node: str) -> HostFacts:
    tray = node in TRAYS
    disks = [
        Disk(path="/", fstype="ext4", total=3500 * GiB, free=2900 * GiB),
        Disk(path="/models", fstype="nfs4", total=200 * TiB, free=120 * TiB, shared=True),
    ]
    return HostFacts(
        hostname=node,
        os="Ubuntu 24.04.2 LTS",
        arch="aarch64" if tray else "x86_64",
        kernel="6.8.0-1028-nvidia-64k" if tray else "6.8.0-60-generic",
        cpu_model="Neoverse-V2" if tray else "Intel(R) Xeon(R) Platinum 8480+",
        cpu_count=TRAY_CPUS if tray else H100_CPUS,
        cpu_cores=TRAY_CPUS if tray else H100_CPUS // 2,
        memory_total=TRAY_MEMORY if tray else H100_MEMORY_TOTAL,
        memory_available=(TRAY_MEMORY if tray else H100_MEMORY_TOTAL) - 40 * GiB,
        disks=disks,
        gpus=_gpus(node),
        gpu_source="nvml",
        cuda_version="13.0",
    )


def _health(node: str, problems: bool) -> list[GpuHealth]:
    common: dict[str, Any] = {
        "persistence_mode": True,
        "ecc_mode": True,
        "ecc_volatile_corrected": 0,
        "ecc_volatile_uncorrected": 0,
        "remapped_correctable": 0,
        "remapped_uncorrectable": 0,
        "remap_pending": False,
        "remap_failed": False,
        "nvlink_links": 18,
        "nvlink_active": 18,
    }
    if node not in TRAYS:  # an HGX board: its own NVSwitch fabric, no domain
        fabric: dict[str, Any] = {
            "fabric_state": "Completed",
            "fabric_status": "Success",
            "fabric_cluster_uuid": ZERO_UUID,
            "fabric_clique_id": 0,
        }
        return [GpuHealth(uuid=_uuid(node, i), index=i, **common, **fabric) for i in range(8)]
    cards = []
    for i in range(GB200_CARDS):
        fabric = {
            "fabric_state": "Completed",
            "fabric_status": "Success",
            "fabric_cluster_uuid": CLUSTER_UUID,
            "fabric_clique_id": CLIQUE_ID,
            "fabric_health": {
                "summary": "Healthy",
                "bandwidth": "Full",
                "route_recovery_in_progress": "False",
                "route_unhealthy": "False",
                "access_timeout_recovery": "False",
            },
        }
        if problems and (node, i) == UNJOINED_CARD:
            fabric = {"fabric_state": "In Progress"}  # status, ids and health: N/A
        cards.append(GpuHealth(uuid=_uuid(node, i), index=i, **common, **fabric))
    return cards


def _ib_ports(node: str, problems: bool) -> list[IbPort]:
    fabric = fabric_of(node)
    if fabric is None:
        return []  # no /sys/class/infiniband on the trays
    ports = []
    for rail in range(RAILS):
        guid = hca_guid(node, rail)
        words, rate = _speed(node, rail, problems)
        stuck = problems and (node, f"mlx5_{rail}") == INIT_PORT
        ports.append(
            IbPort(
                device=f"mlx5_{rail}",
                port=1,
                state="INIT" if stuck else "ACTIVE",
                phys_state="LinkUp",
                rate_gbps=rate,
                width_speed=words.replace("x", "X "),  # sysfs: "400 Gb/sec (4X NDR)"
                link_layer="InfiniBand",
                node_guid=guid,
                port_guid=guid,
                lid=hca_lid(node, rail),
                sm_lid=MASTER_LID,
                counters={
                    "link_downed": 0,
                    "link_error_recovery": 0,
                    "port_rcv_errors": 0,
                    "symbol_error": 0,
                    "port_rcv_data": 0 if stuck else 1_250_000_000 + rail,
                    "port_xmit_data": 0 if stuck else 1_250_100_000 + rail,
                },
                master_sm_guid=FABRIC_IDS[fabric],
                master_sm_lid=MASTER_LID,
            )
        )
    return ports


def _vitals(node: str) -> NodeVitals:
    if node in TRAYS:
        return NodeVitals(
            cpu_temperatures={"package0": 41.0, "package1": 43.0},
            imex_running=True,
            imex_channels=1,
        )
    return NodeVitals(
        cpu_temperatures={"package0": 38.0, "package1": 40.0},
        cpu_power={"package0": 212.0, "package1": 198.5},
    )


def _wire(msg: Message) -> Message:
    """The message as the control plane receives it: encoded, framed, decoded."""
    (payload,) = FrameDecoder().feed(encode_message(msg))
    decoded = decode_message(payload)
    assert decoded is not None and type(decoded) is type(msg), decoded
    return decoded


def _node(reg: NodeRegistry, node: str, serial: int, problems: bool) -> NodeView:
    tray = node in TRAYS
    register = _wire(
        Register(
            node_id=node,
            version="0.9.0",
            host=_facts(node),
            address=f"10.64.{0 if tray else 1 if node[0] == 'a' else 2}.{int(node[-2:])}",
            features=FEATURES_TRAY if tray else FEATURES_IB,
            engines=[EngineInfo(ENGINE, "/var/lib/llmgw/engines/vllm/bin/vllm", "0.11.0", "cuda")],
            engines_probed=True,
        )
    )
    assert isinstance(register, Register)
    # What NodeRegistry.register keeps (it is async and writes to the store with the
    # next flush; this fleet has no store).
    view = reg.nodes[node] = NodeView(id=node, cert_serial=serial)
    view.session = AgentSession(node, problems)
    view.address, view.version = register.address, register.version
    view.facts = register.host
    view.state, view.reason = NodeState.READY, ""
    view.engines = list(register.engines)
    view.engines_probed = register.engines_probed
    view.features = list(register.features)
    beat = _wire(
        Heartbeat(
            seq=1,
            memory_available=register.host.memory_available,
            cpu_percent=3.5,
            load=[0.4, 0.5, 0.5],
            gpus=_gpus(node),
            gpu_health=_health(node, problems),
            vitals=_vitals(node),
            health_warnings=[],
            ib_ports=_ib_ports(node, problems),
        )
    )
    assert isinstance(beat, Heartbeat)
    reg.heartbeat(node, beat)
    return view


def registry(fleet: Mapping[str, NodeView] | None = None, *, problems: bool = True) -> NodeRegistry:
    """A ``NodeRegistry`` holding ``fleet`` (the same view objects), or by default a
    fresh fleet. It has no store: the routes, pages and FabricMaps read ``.nodes``
    only; ``flush``, ``enrolled`` and ``monitor`` would fail."""
    reg = wiring.registry(cast(Store, None))
    if fleet is None:
        for serial, node in enumerate(NODES, 1):
            _node(reg, node, serial, problems)
    else:
        reg.nodes.update(fleet)
    reg.version += 1
    return reg


def views(*, problems: bool = True) -> dict[str, NodeView]:
    """The 64 nodes by id (sorted), connected and Ready, each registered and heard once."""
    return dict(registry(problems=problems).nodes)


def fabric_maps(
    fleet: NodeRegistry | Mapping[str, NodeView] | Iterable[NodeView] | None = None,
    *,
    problems: bool = True,
    clock: Callable[[], float] = clock,
) -> FabricMaps:
    """The maps as the control plane keeps them after one pass: for each fabric the
    ports of ``fleet`` show, its map (``topologies``) read at ``MAP_READ_AT`` by the node
    FabricMaps asks (the first, by id, with ``ibnetdiscover`` and an active port: a-01,
    b-01), and its SM records. ``maps.watch`` is the FabricWatch used (on ``clock``),
    ``maps.registry`` the registry; ``listing(maps.watch, maps, ...)`` is the API's.
    ``problems`` must be what the fleet was made with (the maps are made anew)."""
    if isinstance(fleet, NodeRegistry):
        reg = fleet
    elif fleet is None:
        reg = registry(problems=problems)
    elif isinstance(fleet, Mapping):
        reg = registry(fleet)
    else:
        reg = registry({v.id: v for v in fleet})
    watch = FabricWatch(clock)
    maps = FabricMaps(reg, watch, clock=clock)
    maps_by_id = topologies(problems=problems)
    letters = {fid: f for f, fid in FABRIC_IDS.items()}
    for fabric in watch.fabrics(reg.nodes.values())["fabrics"]:
        fid = str(fabric["id"])
        asker = next(
            (
                p["node"]
                for p in fabric["ports"]
                if p["state"] == "ACTIVE" and "ibnetdiscover" in reg.nodes[p["node"]].features
            ),
            None,
        )
        if fid not in maps_by_id or asker is None:
            continue
        maps.maps[fid] = (MAP_READ_AT, str(asker), maps_by_id[fid])
        maps.managers[fid] = smir(letters[fid], problems=problems)
    return maps
