"""Plain-text tables for ``ctl``: what an operator reads at a glance; absent is a dash."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence

from llmgw.wire.admin import (
    Collected,
    DiskJson,
    NodeJson,
    ReplicaJson,
    SpanJson,
    StatusJson,
    WeightsEntry,
)

DASH = "-"


def gib(value: object) -> str:
    if not isinstance(value, int | float):
        return DASH
    return f"{value / 2**30:.1f}"


def binary(value: object) -> str:
    """Bytes in binary units, as memory is sold: 0.5 GiB, 498 KiB."""
    if not isinstance(value, int | float):
        return DASH
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def count(value: object) -> str:
    """A large count shortly: 8.03B, 125K."""
    if not isinstance(value, int | float):
        return DASH
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return str(value)


def ago(ts: object, now: float | None = None) -> str:
    if not isinstance(ts, int | float):
        return DASH
    secs = max(0, int((now or time.time()) - ts))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def when(at: object) -> str:
    """A UTC timestamp as ``YYYY-MM-DD HH:MM:SS``; a dash when there is none."""
    if not isinstance(at, int | float):
        return "-"
    return dt.datetime.fromtimestamp(float(at), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def local_disk(disks: list[DiskJson] | None) -> tuple[int, int] | None:
    """(free, total) of a node's own filesystems; shared ones belong to everyone."""
    if not isinstance(disks, list):
        return None
    own = [d for d in disks if not d.get("shared")]
    if not own:
        return None
    return sum(d["free"] for d in own), sum(d["total"] for d in own)


def nodes_table(nodes: list[NodeJson]) -> str:
    if not nodes:
        return (
            "No nodes yet. Add one: `llmgw node add HOST`, or `llmgw node token` and "
            "`llmgw agent run --server HOST:PORT --token TOKEN` on the node."
        )
    rows = []
    for n in nodes:
        mem_total, mem_avail = n.get("memory_total"), n.get("memory_available")
        memory = f"{gib(mem_avail)}/{gib(mem_total)}" if mem_total else DASH
        disk = local_disk(n.get("disks"))
        gpus = n.get("gpus") or []
        gpu_text = str(len(gpus)) if gpus else "0"
        if gpus:
            names = sorted({g.get("name", "?") for g in gpus})
            gpu_text += " " + ",".join(names)
        load = n.get("load")
        state = n["state"]
        if n.get("draining"):
            state += ",Draining"
        elif n.get("cordoned"):
            state += ",Cordoned"
        slurm = n.get("slurm")
        if slurm and slurm != "serving":
            # Lent to Slurm (or on its way there or back): `llmgw ctl slurm status`.
            state += f",{slurm}"
        rows.append(
            [
                n["id"],
                state,
                n.get("address") or DASH,
                str(n["cpu_count"]) if n.get("cpu_count") else DASH,
                f"{n['cpu_percent']:.0f}%"
                if isinstance(n.get("cpu_percent"), int | float)
                else DASH,
                f"{load[0]:.2f}" if load else DASH,
                memory,
                f"{gib(disk[0])}/{gib(disk[1])}" if disk else DASH,
                gpu_text,
                str(len(n.get("warnings") or [])),
                ago(n.get("last_seen")),
            ]
        )
    heads = ["NODE", "STATE", "ADDRESS", "CPUS", "CPU", "LOAD", "MEM GiB", "DISK GiB", "GPUS"]
    table = render([*heads, "WARN", "SEEN"], rows)
    said = [f"{n['id']}: {w}" for n in nodes for w in n.get("warnings") or [] if isinstance(w, str)]
    return table + ("\n\nWarnings:\n" + "\n".join(said) if said else "")


def status_text(status: StatusJson) -> str:
    nodes = status.get("nodes", {})
    hb = status.get("heartbeat_handling", {})
    p99 = hb.get("p99_ms")
    up = ago(time.time() - status.get("uptime_seconds", 0))
    lines = [
        f"llmgw control plane {status.get('version')}, up {up}",
        f"  listen:      {status.get('listen')}   agents' port: {status.get('agent_port')}",
        f"  store:       {status.get('store')}   leader: {'yes' if status.get('leader') else 'no'}",
        f"  nodes:       {nodes.get('ready', 0)} Ready of {nodes.get('total', 0)}"
        + (f" ({nodes['not_ready']} NotReady)" if nodes.get("not_ready") else ""),
        f"  streams:     {status.get('agent_streams', 0)} agents connected, "
        f"{status.get('heartbeats', 0)} heartbeats handled"
        + (f", p99 {p99} ms" if p99 is not None else ""),
        f"  CA:          sha256 {str(status.get('ca_fingerprint', ''))[:32]}...",
    ]
    lines.insert(3, f"  store write: {store_line(status)}")
    return "\n".join(lines)


def store_line(status: StatusJson) -> str:
    """Whether the store takes writes; when not, why and the fix."""
    if status.get("store_writable", True):
        return "writable"
    return f"NOT WRITABLE: {status.get('store_problem')} (serving goes on from memory)"


def size(value: object) -> str:
    if not isinstance(value, int | float):
        return DASH
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def replicas_table(rows: list[ReplicaJson]) -> str:
    if not rows:
        return "No replicas running."
    lines = []
    out = []
    for r in rows:
        compute = r.get("backend") or DASH
        if r.get("offloaded_layers") is not None:
            compute += f" {r['offloaded_layers']}/{r.get('total_layers')} layers"
        if r.get("devices"):
            compute += " " + ",".join(r["devices"])
        cards = r.get("cards") or []
        out.append(
            [
                r["replica_id"],
                r.get("model") or DASH,
                r["node"],
                r.get("state") or DASH,
                r.get("engine") or DASH,
                ",".join(c[:12] for c in cards) if cards else DASH,
                str(r["port"]) if r.get("port") else DASH,
                str(r["pid"]) if r.get("pid") else DASH,
                compute,
                size(r.get("rss")),
            ]
        )
    headers = ["REPLICA", "MODEL", "NODE", "STATE", "ENGINE", "CARDS", "PORT", "PID", "COMPUTE"]
    table = render([*headers, "RSS"], out)
    for row, r in zip(table.splitlines()[1:], rows, strict=True):
        lines.append(row)
        download = r.get("download")
        if download:
            total = download.get("total")
            got = size(download.get("done"))
            lines.append(
                f"    downloading {download.get('file') or download.get('source')}: "
                + (f"{got} of {size(total)}" if total else f"{got} so far")
            )
        if r.get("state") == "failed" and r.get("reason"):
            lines.append(f"    {r['reason']}")
        if r.get("note"):
            lines.append(f"    {r['note']}")
    return "\n".join([table.splitlines()[0], *lines])


def weights_table(rows: list[WeightsEntry]) -> str:
    if not rows:
        return "No weights on any node."
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["node"], DASH, DASH, DASH, r["error"]])
            continue
        out.append(
            [
                r["node"],
                r.get("name", DASH),
                size(r.get("total_bytes")),
                "in use" if r.get("wanted") else "unused",
                (r.get("source") or "?") + ("" if r.get("complete") else " (partial)"),
            ]
        )
    return render(["NODE", "NAME", "SIZE", "USE", "SOURCE"], out)


def collect_text(result: list[Collected]) -> str:
    lines = []
    for node in result:
        if "error" in node:
            lines.append(f"{node['node']}: {node['error']}")
            continue
        lines.append(
            f"{node['node']}: asked to remove {len(node['asked'])}, removed "
            f"{len(node['removed'])} ({size(node['freed_bytes'])} freed)"
        )
        for kept in node["kept"]:
            lines.append(f"    kept {kept['path']}: {kept['reason']}")
        for name in node.get("still_listed", []):
            lines.append(f"    still listed after collecting: {name}")
    return "\n".join(lines) or "Nothing to collect."


def span_line(span: SpanJson) -> str:
    """One set of nodes a replica spanning nodes could go to, as `ctl explain` says it."""
    kind = {"nvlink": "NVLink domain", "fabric": "InfiniBand fabric"}.get(span["kind"])
    where = f"{kind} {span['id']}" if kind else "nodes without InfiniBand"
    if span["ok"]:
        said = f"fits on {', '.join(span['chosen'])}"
    else:
        said = f"no: {span['reason']} ({', '.join(span['fitting']) or 'none'})"
    notes = "".join(f"; {n}" for n in span["notes"])
    return f"{where}: {said}{notes}"
