"""``llmgw ctl fabric-test A B``: ``ib_write_bw`` between two nodes, adapter by adapter,
one rail at a time (A's first active adapter with B's first, and so on), over the
agents' streams: B's agent starts the server, A's runs the client against B's address.
Each rail's figure is graded against the slower end's link rate.

An agent that cannot run the tool (no ``ib_write_bw`` feature in its Register) is
refused before anything starts, as is a node with no active RDMA port.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.wire.hardware import IbPort

FEATURE = "ib_write_bw"
FIRST_PORT = 18515  # perftest's own default; one port per rail from there
GOOD, FAIR = 0.9, 0.7


class FabricTestRefused(ValueError):
    """A test that cannot run; says which node and why."""


Grade = Literal["good", "fair", "poor", "unknown", "failed"]


class RailJson(TypedDict):
    """One rail of a test: the adapters paired, the slower link rate, the measured
    bandwidth (None where it was not measured) and its grade."""

    rail: int
    a_device: str
    b_device: str
    rate_gbps: float | None
    gbps: float | None
    ratio: float | None
    grade: Grade
    error: str | None


class FabricTestJson(TypedDict):
    a: str
    b: str
    seconds: int
    rails: list[RailJson]


def grade(gbps: float | None, rate: float | None) -> tuple[float | None, Grade]:
    """(share of the link rate, grade): good at 90% or more, fair from 70%, poor below;
    ``unknown`` when either figure was not read."""
    if gbps is None or not rate:
        return None, "unknown"
    ratio = gbps / rate
    return round(ratio, 3), "good" if ratio >= GOOD else "fair" if ratio >= FAIR else "poor"


def _active(view: NodeView) -> list[IbPort]:
    return [p for p in view.live.ib_ports or () if p.state == "ACTIVE"]


def _ready(registry: NodeRegistry, node_id: str) -> NodeView:
    view = registry.nodes.get(node_id)
    if view is None:
        raise FabricTestRefused(f"no node {node_id!r}; `llmgw ctl nodes` lists them")
    if view.session is None:
        raise FabricTestRefused(f"{node_id} is not connected")
    if FEATURE not in view.features:
        raise FabricTestRefused(
            f"{node_id} cannot run {FEATURE} (install perftest on it: apt install perftest)"
        )
    if not _active(view):
        raise FabricTestRefused(f"{node_id} has no active InfiniBand or RoCE port")
    return view


async def _ask(view: NodeView, kind: str, args: dict[str, Any], timeout: float) -> Any:
    assert view.session is not None
    async for answer in view.session.ask(kind, args, timeout=timeout):
        if not answer.ok:
            raise RuntimeError(answer.error or "it said no")
        return answer.result
    raise RuntimeError("no answer")


async def fabric_test(registry: NodeRegistry, a: str, b: str, seconds: int = 5) -> FabricTestJson:
    if a == b:
        raise FabricTestRefused("give two different nodes")
    client, server = _ready(registry, a), _ready(registry, b)
    address = server.address
    if not address:
        raise FabricTestRefused(f"{b} has no address the other node can reach")
    rails: list[RailJson] = []
    pairs = zip(_active(client), _active(server), strict=False)
    for i, (pa, pb) in enumerate(pairs):
        tcp_port = FIRST_PORT + i
        rates = [r for r in (pa.rate_gbps, pb.rate_gbps) if r]
        rate = min(rates) if rates else None
        row: RailJson = {
            "rail": i,
            "a_device": f"{pa.device}/{pa.port}",
            "b_device": f"{pb.device}/{pb.port}",
            "rate_gbps": rate,
            "gbps": None,
            "ratio": None,
            "grade": "failed",
            "error": None,
        }
        common = {"ib_port": 0, "tcp_port": tcp_port, "seconds": seconds}
        try:
            await _ask(
                server,
                "fabric.bw_serve",
                {**common, "device": pb.device, "ib_port": pb.port},
                timeout=30,
            )
            result = await _ask(
                client,
                "fabric.bw_run",
                {
                    **common,
                    "device": pa.device,
                    "ib_port": pa.port,
                    "server": address,
                },
                timeout=seconds + 60,
            )
        except (RuntimeError, ConnectionError, TimeoutError) as exc:
            row["error"] = str(exc)
            rails.append(row)
            continue
        said = result.get("gbps") if isinstance(result, dict) else None
        gbps = float(said) if isinstance(said, int | float) and not isinstance(said, bool) else None
        row["gbps"] = gbps
        row["ratio"], row["grade"] = grade(gbps, rate)
        rails.append(row)
    return {"a": a, "b": b, "seconds": seconds, "rails": rails}
