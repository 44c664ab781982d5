"""InfiniBand and RoCE ports: what each RDMA port is, whether it is up, and how it is doing.

The kernel is read first (``read_sysfs``): ``/sys/class/infiniband/<dev>`` holds every
RDMA device the driver registered, whether or not any userspace tool is installed.
Files read, and what the kernel writes in them (drivers/infiniband/core/sysfs.c):

- ``<dev>/node_guid``: four colon-separated groups, ``0c42:a103:00b5:d8a2``.
- ``ports/N/state``: ``4: ACTIVE`` (number and word); ``phys_state``: ``5: LinkUp``.
- ``ports/N/rate``: ``400 Gb/sec (4X NDR)``; the width/speed words are kept; SDR has no
  speed word (``10 Gb/sec (4X)``), a port with no valid width answers an error.
- ``ports/N/lid`` and ``sm_lid``: hexadecimal (``0x80``), unlike ibstat's decimal.
- ``ports/N/link_layer``: ``InfiniBand`` or ``Ethernet`` (RoCE).
- ``ports/N/gids/I``: the GID table, as full IPv6 (``fe80:0000:...``); an empty slot is
  all zeros. GID 0's low 64 bits are the port GUID (what ibstat prints as Port GUID).
- ``ports/N/gid_attrs/types/I``: ``IB/RoCE v1`` or ``RoCE v2``; ``gid_attrs/ndevs/I``
  the net device behind a RoCE GID. Empty slots answer an error on newer kernels.
- ``ports/N/counters/*``: the IB PortCounters; ``N/A (no PMA)`` where the driver has no
  performance agent. ``port_xmit_data``/``port_rcv_data`` count octets divided by 4.
- ``ports/N/hw_counters/*``: driver counters (mlx5: ``out_of_buffer``, ``np_cnp_sent``,
  ``rp_cnp_handled``, ...); ``lifespan`` there is a setting, not a counter.

A RoCE port's networks are its RoCE v2 GIDs that carry an IP address (IPv4-mapped
``::ffff:a.b.c.d`` or a global IPv6 one; link-local ``fe80::/10`` is the same on every
link and is left out). The GID gives the address only; its prefix length comes from the
net device's connected route in ``/proc/net/route`` (IPv4) or ``/proc/net/if_inet6``
(IPv6), and is the host prefix (/32, /128) where neither says.

Where the kernel shows no device (old containers without the sysfs class), ``read_ports``
falls back to ``ibstat``, which gives state, rate and GUIDs but no GIDs or counters.
The parsers of ``ibstat``, ``sminfo``, ``perfquery -x`` and ``ib_write_bw`` are pure.

The contract, as for the other discovery readers: a figure not read is None or an absent
key, never 0; an absent tool, device or file means no ports (``[]``) or ``None``; nothing
here raises for absence or odd text.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw.agent import command
from llmgw.wire.hardware import IbPort

# ibstat's port state words -> the kernel's (sysfs ``state``), so both sources agree.
_IBSTAT_STATE = {"Down": "DOWN", "Initializing": "INIT", "Armed": "ARMED", "Active": "ACTIVE"}
# sysfs ``phys_state`` words that ibstat spells otherwise.
_SYSFS_PHYS = {"Phy Test": "PhyTest", "<unknown>": "Unknown"}
# sminfo's ``state N`` numbers, for output that gives the number without the word.
_SM_STATES = {0: "SMINFO_NOTACTIVE", 1: "SMINFO_DISCOVER", 2: "SMINFO_STANDBY", 3: "SMINFO_MASTER"}
# perfquery fields that select what was read, not counts of anything.
_PERFQUERY_SELECTORS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})
# perftest's MB/sec is 2**20 bytes a second (format_factor 0x100000); Gb/sec is 10**9 bits.
_MBPS_TO_GBPS = 2**20 * 8 / 1e9

_NUMBERED = re.compile(r"^\s*\d+:\s*(?P<word>.+?)\s*$")
_RATE = re.compile(r"^\s*(?P<gbps>\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\((?P<words>[^)]*)\))?")
_CA = re.compile(r"^CA\s+'(?P<name>[^']+)'")
_PORT = re.compile(r"^\s+Port\s+(?P<port>\d+):\s*$")
_FIELD = re.compile(r"^\s+(?P<key>[A-Za-z][A-Za-z ]*?):\s*(?P<value>.*?)\s*$")
_PERF_HEADER = re.compile(r"^#\s*Port (?:extended )?counters:.*?\bport\s+(?P<port>\d+)", re.I)
_PERF_FIELD = re.compile(r"^(?P<name>\w+):\.*\s*(?P<value>\S+)\s*$")
_BW_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(?P<unit>[^\]]+)\]\s+BW average\[[^\]]+\]"
)
_BW_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<iters>\d+)\s+(?P<peak>\d+(?:\.\d+)?)\s+"
    r"(?P<avg>\d+(?:\.\d+)?)(?:\s+(?P<rate>\d+(?:\.\d+)?))?\s*$"
)
_NATURAL = re.compile(r"(\d+)")


@dataclass(frozen=True)
class SmInfo:
    """The subnet manager a port sees (``sminfo``): its LID, GUID, priority and state.

    ``activity`` is the SM's activity count, which a live master keeps raising; the same
    figure twice apart means a stuck SM.
    """

    sm_lid: int
    sm_guid: str | None
    priority: int
    state: str
    activity: int | None = None


@dataclass(frozen=True)
class BandwidthRun:
    """One row of a perftest bandwidth table (``ib_write_bw`` and friends).

    ``bw_unit`` is the header's unit: "MB/sec" (2**20 bytes a second, not 10**6) or
    "Gb/sec" with ``--report_gbits``. ``msg_rate_mpps`` is None where the table has no
    MsgRate column.
    """

    size_bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    bw_unit: str
    msg_rate_mpps: float | None = None

    @property
    def bw_average_gbps(self) -> float | None:
        """The average in Gb/s whichever unit the tool printed; None for an unknown unit."""
        if self.bw_unit == "Gb/sec":
            return self.bw_average
        if self.bw_unit == "MB/sec":
            return self.bw_average * _MBPS_TO_GBPS
        return None


def normalise_guid(text: str) -> str | None:
    """``0x0C42A1...``, ``0c42:a103:00b5:d8a2`` -> ``0x0c42a10300b5d8a2``; zero or junk -> None."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    if not digits or len(digits) > 16 or not re.fullmatch(r"[0-9a-f]+", digits):
        return None
    if int(digits, 16) == 0:
        return None
    return "0x" + digits.zfill(16)


def _natural(name: str) -> list[int | str]:
    """Sort key that puts mlx5_2 before mlx5_10."""
    return [int(p) if p.isdigit() else p for p in _NATURAL.split(name)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except (OSError, ValueError):
        return None


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def _numbered_word(text: str | None) -> str | None:
    """``4: ACTIVE`` -> ``ACTIVE``; text without the number as it is."""
    if not text:
        return None
    m = _NUMBERED.match(text)
    return m["word"] if m else text.strip()


def _rate(text: str | None) -> tuple[float | None, str | None]:
    m = _RATE.match(text or "")
    if m is None:
        return None, None
    return float(m["gbps"]), (m["words"] or "").strip() or None


def _counters(directory: Path, skip: frozenset[str] = frozenset()) -> dict[str, int]:
    """Each readable whole-number file of ``directory``; ``N/A (no PMA)`` and the like out."""
    try:
        files = sorted(p for p in directory.iterdir() if p.name not in skip)
    except OSError:
        return {}
    out: dict[str, int] = {}
    for path in files:
        value = _int(_read(path))
        if value is not None and value >= 0:
            out[path.name] = value
    return out


def _gid(text: str | None) -> ipaddress.IPv6Address | None:
    if not text:
        return None
    try:
        gid = ipaddress.IPv6Address(text)
    except ValueError:
        return None
    return gid if int(gid) else None


def _ipv4_routes(root: Path) -> list[tuple[str, ipaddress.IPv4Network]]:
    """(interface, network) of each connected (gateway-less) route in /proc/net/route."""
    text = _read(root / "proc/net/route") or ""
    routes: list[tuple[str, ipaddress.IPv4Network]] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or _int(cols[2], 16) != 0:
            continue
        dest, mask = _int(cols[1], 16), _int(cols[7], 16)
        if dest is None or mask is None or mask == 0:
            continue
        # The kernel prints each __be32 as a host-order number: back to wire order.
        net = ipaddress.IPv4Address(dest.to_bytes(4, sys.byteorder))
        netmask = ipaddress.IPv4Address(mask.to_bytes(4, sys.byteorder))
        try:
            routes.append((cols[0], ipaddress.IPv4Network(f"{net}/{netmask}")))
        except ValueError:
            continue
    return routes


def _ipv6_prefixes(root: Path) -> dict[ipaddress.IPv6Address, int]:
    """Address -> prefix length from /proc/net/if_inet6 (all figures there are hex)."""
    text = _read(root / "proc/net/if_inet6") or ""
    out: dict[ipaddress.IPv6Address, int] = {}
    for line in text.splitlines():
        cols = line.split()
        prefix = _int(cols[2], 16) if len(cols) >= 6 and len(cols[0]) == 32 else None
        if prefix is None:
            continue
        try:
            out[ipaddress.IPv6Address(int(cols[0], 16))] = prefix
        except ValueError:
            continue
    return out


@dataclass
class _Prefixes:
    """The system's own prefix lengths, read once per port and only when a GID needs them."""

    root: Path
    _v4: list[tuple[str, ipaddress.IPv4Network]] | None = None
    _v6: dict[ipaddress.IPv6Address, int] | None = None

    def network(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, ndev: str) -> str:
        """The address's network as a CIDR; the host prefix where the system does not say.

        An IPv4 route on the GID's own net device wins; a route on another one (a bond
        whose GIDs name a slave) is taken when the device has none."""
        if isinstance(address, ipaddress.IPv6Address):
            if self._v6 is None:
                self._v6 = _ipv6_prefixes(self.root)
            prefix = self._v6.get(address, 128)
            return str(ipaddress.IPv6Network(f"{address}/{prefix}", strict=False))
        if self._v4 is None:
            self._v4 = _ipv4_routes(self.root)
        found = [(dev == ndev, net) for dev, net in self._v4 if address in net]
        if not found:
            return f"{address}/32"
        return str(max(found, key=lambda item: (item[0], item[1].prefixlen))[1])


def _roce_networks(port_dir: Path, root: Path) -> list[str]:
    """The networks of a port's RoCE v2 GIDs that carry an IP address, in GID order."""
    try:
        indices = sorted(int(p.name) for p in (port_dir / "gids").iterdir() if p.name.isdigit())
    except OSError:
        return []
    prefixes = _Prefixes(root)
    networks: list[str] = []
    for i in indices:
        gid = _gid(_read(port_dir / "gids" / str(i)))
        if gid is None or _read(port_dir / "gid_attrs" / "types" / str(i)) != "RoCE v2":
            continue
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = gid.ipv4_mapped or gid
        if isinstance(address, ipaddress.IPv6Address) and address.is_link_local:
            continue
        net = prefixes.network(address, _read(port_dir / "gid_attrs" / "ndevs" / str(i)) or "")
        if net not in networks:
            networks.append(net)
    return networks


def _sysfs_port(device: Path, port_dir: Path, node_guid: str | None, root: Path) -> IbPort:
    rate, words = _rate(_read(port_dir / "rate"))
    link_layer = _read(port_dir / "link_layer") or None
    ethernet = link_layer == "Ethernet"
    phys = _numbered_word(_read(port_dir / "phys_state"))
    gid0 = _gid(_read(port_dir / "gids" / "0"))
    counters = _counters(port_dir / "hw_counters", frozenset({"lifespan"}))
    counters.update(_counters(port_dir / "counters"))
    return IbPort(
        device=device.name,
        port=int(port_dir.name),
        state=_numbered_word(_read(port_dir / "state")),
        phys_state=_SYSFS_PHYS.get(phys, phys) if phys else None,
        rate_gbps=rate,
        width_speed=words,
        link_layer=link_layer,
        node_guid=node_guid,
        port_guid=normalise_guid(f"{int(gid0) & (2**64 - 1):x}") if gid0 else None,
        lid=None if ethernet else _int(_read(port_dir / "lid"), 16),
        sm_lid=None if ethernet else _int(_read(port_dir / "sm_lid"), 16),
        roce_networks=_roce_networks(port_dir, root) if ethernet else [],
        counters=counters,
    )


def read_sysfs(root: Path = Path("/")) -> list[IbPort]:
    """Every port under ``root/sys/class/infiniband``, by device (mlx5_2 before mlx5_10)
    and port number; [] where the class is absent. Blocking: call through to_thread."""
    try:
        devices = sorted((root / "sys/class/infiniband").iterdir(), key=lambda p: _natural(p.name))
    except OSError:
        return []
    ports: list[IbPort] = []
    for device in devices:
        node_guid = normalise_guid(_read(device / "node_guid") or "")
        try:
            port_dirs = sorted(
                (p for p in (device / "ports").iterdir() if p.name.isdigit()),
                key=lambda p: int(p.name),
            )
        except OSError:
            continue
        ports.extend(_sysfs_port(device, p, node_guid, root) for p in port_dirs)
    return ports


def _ibstat_port(device: str, port: int, node_guid: str | None, fields: dict[str, str]) -> IbPort:
    link_layer = fields.get("Link layer") or None
    ethernet = link_layer == "Ethernet"
    rate = fields.get("Rate")
    try:
        rate_gbps = float(rate) if rate else None
    except ValueError:
        rate_gbps = None
    state = fields.get("State")
    return IbPort(
        device=device,
        port=port,
        state=_IBSTAT_STATE.get(state, state.upper()) if state else None,
        phys_state=fields.get("Physical state") or None,
        rate_gbps=rate_gbps,
        link_layer=link_layer,
        node_guid=node_guid,
        port_guid=normalise_guid(fields.get("Port GUID", "")),
        lid=None if ethernet else _int(fields.get("Base lid")),
        sm_lid=None if ethernet else _int(fields.get("SM lid")),
    )


def parse_ibstat(text: str) -> list[IbPort]:
    """``ibstat``: each CA's ports in the order printed. Indentation may be spaces or tabs;
    both are seen. ibstat shows no GIDs or counters, so those stay empty."""
    ports: list[IbPort] = []
    device: str | None = None
    node_guid: str | None = None
    current: tuple[int, dict[str, str]] | None = None

    def flush() -> None:
        if device is not None and current is not None:
            ports.append(_ibstat_port(device, current[0], node_guid, current[1]))

    for line in text.splitlines():
        if m := _CA.match(line):
            flush()
            device, node_guid, current = m["name"], None, None
        elif device is None:
            continue
        elif m := _PORT.match(line):
            flush()
            current = (int(m["port"]), {})
        elif m := _FIELD.match(line):
            if current is not None:
                current[1][m["key"]] = m["value"]
            elif m["key"] == "Node GUID":
                node_guid = normalise_guid(m["value"])
    flush()
    return ports


def parse_sminfo(text: str) -> SmInfo | None:
    """``sminfo: sm lid 2 sm guid 0x..., activity count 1671874 priority 0 state 3
    SMINFO_MASTER``; None where no such line is found (an error, no SM answered)."""
    for line in text.splitlines():
        lid = re.search(r"\bsm lid (\d+)", line)
        priority = re.search(r"\bpriority (\d+)", line)
        state = re.search(r"\bstate (\d+)(?:\s+(SMINFO_\w+))?", line)
        if lid is None or priority is None or state is None:
            continue
        guid = re.search(r"\bsm guid (0x[0-9a-fA-F]+)", line)
        activity = re.search(r"\bactivity count (\d+)", line)
        return SmInfo(
            sm_lid=int(lid[1]),
            sm_guid=normalise_guid(guid[1]) if guid else None,
            priority=int(priority[1]),
            state=state[2] or _SM_STATES.get(int(state[1]), f"state {state[1]}"),
            activity=int(activity[1]) if activity else None,
        )
    return None


def parse_perfquery_ports(text: str) -> dict[int, dict[str, int]]:
    """``perfquery [-x]``: each port's counters under perfquery's names (PortXmitData,
    SymbolErrorCounter, ...), keyed by the port in the ``# Port ... counters`` header (255
    for ``-a``). Selectors (PortSelect, CounterSelect*) and hex fields are left out.
    Lines before any header count for the port their PortSelect names."""
    ports: dict[int, dict[str, int]] = {}
    counts: dict[str, int] | None = None
    for line in text.splitlines():
        if m := _PERF_HEADER.match(line):
            counts = ports.setdefault(int(m["port"]), {})
            continue
        m = _PERF_FIELD.match(line.strip())
        if m is None:
            continue
        if counts is None:
            if m["name"] != "PortSelect" or (port := _int(m["value"])) is None:
                continue
            counts = ports.setdefault(port, {})
        if m["name"] in _PERFQUERY_SELECTORS or not m["value"].isdigit():
            continue
        counts[m["name"]] = int(m["value"])
    return ports


def parse_perfquery(text: str) -> dict[str, int]:
    """The counters of the first port in a ``perfquery [-x]`` capture; {} when none.
    A multi-port capture wants ``parse_perfquery_ports``: ports are not summed here."""
    ports = parse_perfquery_ports(text)
    return next(iter(ports.values()), {})


def parse_ib_write_bw(text: str) -> list[BandwidthRun]:
    """The rows of each bandwidth table in perftest output, in order.

    Anything between rows that is not a row is skipped: the cpufreq "Conflicting CPU
    frequency values" warnings printed inside the table, banners, address lines. A row
    identical to one already read is dropped: a loopback run logs both ends, and the
    server repeats the client's last row.
    """
    rows: list[BandwidthRun] = []
    unit: str | None = None
    for line in text.splitlines():
        if m := _BW_HEADER.search(line):
            unit = m["unit"]
            continue
        if unit is None or (m := _BW_ROW.match(line)) is None:
            continue
        row = BandwidthRun(
            size_bytes=int(m["size"]),
            iterations=int(m["iters"]),
            bw_peak=float(m["peak"]),
            bw_average=float(m["avg"]),
            bw_unit=unit,
            msg_rate_mpps=float(m["rate"]) if m["rate"] else None,
        )
        if row not in rows:
            rows.append(row)
    return rows


async def _run(args: Sequence[str], timeout: float) -> str | None:
    """What the command printed on stdout when it ran and exited 0, else None; stderr
    (ibwarn lines, umad errors) is dropped so it cannot be read as output."""
    try:
        done = await command.run(args, timeout, stderr="drop")
    except (OSError, TimeoutError):
        return None
    return done.out if done.code == 0 else None


async def read_ports(
    root: Path = Path("/"), *, ibstat: str | None = "ibstat", timeout: float = 10.0
) -> list[IbPort]:
    """The node's RDMA ports: sysfs first; ``ibstat`` only where sysfs shows no device
    and the tool is on PATH (None turns it off). [] where neither shows a port."""
    ports = await asyncio.to_thread(read_sysfs, root)
    if ports or ibstat is None or shutil.which(ibstat) is None:
        return ports
    output = await _run([ibstat], timeout)
    return parse_ibstat(output) if output else []


async def read_sminfo(
    device: str, port: int, *, sminfo: str = "sminfo", timeout: float = 10.0
) -> SmInfo | None:
    """The master SM that ``device``/``port`` sees, from ``sminfo -C DEVICE -P PORT``;
    None where the tool is absent, fails (no SM, a RoCE port, no umad access) or is slow."""
    if shutil.which(sminfo) is None:
        return None
    output = await _run([sminfo, "-C", device, "-P", str(port)], timeout)
    return parse_sminfo(output) if output else None
