"""The simulated fleet: ``NodeView`` objects as the registry would hold them once every
agent had registered, from a recorded ``llmgw ctl nodes --json`` (or YAML of the same
shape) or generated from ``--nodes 2000x8xH100``.

Each view has a stand-in session (``SimSession``): the reconcile loop's ``Dispatch``
sends its StartShard and StopShard messages down it as it would down an agent's
stream, and the simulation's agents (``run.py``) act on what arrived.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from llmgw.server.fleet.nodeview import NodeView
from llmgw.sim.cards import GIB, NodeShape, SimError
from llmgw.wire.hardware import GPU, Disk, HostFacts
from llmgw.wire.messages import EngineInfo, Message, MessageError, Response, from_map
from llmgw.wire.states import NodeState

TB = 1000**4
# What a generated node has besides its cards: per card, CPU threads and host memory
# (a DGX H100 has 224 threads and 2 TiB for 8 cards) and local disk.
THREADS_PER_CARD = 28
MEMORY_PER_CARD = 256 * GIB
DISK_PER_CARD = 4 * TB
CPU_NODE_THREADS = 64
CPU_NODE_MEMORY = 512 * GIB
CPU_NODE_DISK = 4 * TB
ENGINES = (("llama.cpp", "/opt/llmgw/engines/llama-server"), ("vllm", "/opt/llmgw/engines/vllm"))


class SimSession:
    """An agent's stream as the simulation has it: what was sent, in order, until taken."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.closed: str | None = None

    def close(self, reason: str) -> None:
        self.closed = reason

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        yield Response(id="sim", ok=False, error=f"a simulated agent answers no {kind!r}")

    def take(self) -> list[Message]:
        sent, self.sent = self.sent, []
        return sent


def generated(shape: NodeShape) -> dict[str, NodeView]:
    """``shape.count`` Ready nodes ``gpu1``.. (``cpu1``.. without cards), each with
    llama.cpp and vLLM installed."""
    prefix = "gpu" if shape.cards else "cpu"
    card = shape.card
    nodes: dict[str, NodeView] = {}
    for i in range(1, shape.count + 1):
        nid = f"{prefix}{i}"
        gpus = [
            GPU(
                index=k,
                uuid=f"GPU-{nid}-{k}",
                name=card.name,
                memory_total=card.memory,
                memory_used=0,
                compute_capability=card.compute_capability,
                driver=card.driver,
                power_limit=card.power_w,
            )
            for k in range(shape.cards)
        ]
        threads = THREADS_PER_CARD * shape.cards or CPU_NODE_THREADS
        memory = MEMORY_PER_CARD * shape.cards or CPU_NODE_MEMORY
        disk = DISK_PER_CARD * shape.cards or CPU_NODE_DISK
        facts = HostFacts(
            hostname=nid,
            os="Linux",
            arch="x86_64",
            cpu_count=threads,
            cpu_cores=threads // 2,
            memory_total=memory,
            memory_available=memory,
            disks=[Disk(path="/var/lib/llmgw", fstype="xfs", total=disk, free=disk)],
            gpus=gpus,
        )
        nodes[nid] = _view(nid, i, facts, [EngineInfo(name=n, path=p) for n, p in ENGINES])
    return nodes


def _view(nid: str, serial: int, facts: HostFacts, engines: list[EngineInfo]) -> NodeView:
    return NodeView(
        id=nid,
        cert_serial=serial,
        state=NodeState.READY,
        address=nid,
        facts=facts,
        last_heartbeat=0.0,
        session=SimSession(),
        engines=engines,
        engines_probed=True,
    )


def read_fleet(path: Path) -> dict[str, NodeView]:
    """A recorded ``ctl nodes --json`` (a list of nodes), as JSON or YAML."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SimError(f"--fleet {path}: cannot read it: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SimError(f"--fleet {path}: not JSON or YAML: {exc}") from None
    if not isinstance(data, list) or not data:
        raise SimError(
            f"--fleet {path}: give a list of nodes as `llmgw ctl nodes --json` prints it"
        )
    nodes: dict[str, NodeView] = {}
    for i, entry in enumerate(data, start=1):
        where = f"--fleet {path}: node {i}"
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise SimError(f"{where}: a node is an object with its id (as `ctl nodes --json`)")
        nid = entry["id"]
        if nid in nodes:
            raise SimError(f"{where}: {nid} is listed twice")
        try:
            view = _recorded(nid, i, entry)
        except (MessageError, TypeError, ValueError) as exc:
            raise SimError(f"{where} ({nid}): {exc}") from None
        nodes[nid] = view
    return nodes


def _recorded(nid: str, serial: int, entry: Mapping[str, Any]) -> NodeView:
    """The node as if it ran nothing: what runs in the simulation is MODELS.yaml alone,
    so its cards and memory start free."""
    # The facts the simulation takes, decoded (and checked) as the store's copy of a
    # Register is: the card and disk records whole, a figure of the wrong type refused.
    taken = {k: entry.get(k) for k in ("cpu_count", "cpu_cores", "memory_total", "disks", "gpus")}
    read = from_map(
        HostFacts,
        {
            "hostname": str(entry.get("hostname") or nid),
            "os": str(entry.get("os") or "Linux"),
            "arch": str(entry.get("arch") or "x86_64"),
            **{k: v for k, v in taken.items() if v is not None},
        },
        "node",
    )
    facts = replace(
        read,
        memory_available=read.memory_total,
        gpus=[replace(g, memory_used=0, processes=None) for g in read.gpus],
    )
    engines = entry.get("engines")
    view = _view(nid, serial, facts, [from_map(EngineInfo, e, "engine") for e in engines or []])
    view.engines_probed = engines is not None
    view.state = NodeState(entry.get("state") or NodeState.READY)
    view.address = entry.get("address") or nid
    view.installable = [str(e) for e in entry.get("engines_installable") or []]
    view.cordoned = bool(entry.get("cordoned"))
    view.draining = bool(entry.get("draining"))
    view.labels = {str(k): str(v) for k, v in (entry.get("labels") or {}).items()}
    view.live.memory_read_gbs = entry.get("memory_read_gbs")
    view.live.memory_read_one_core_gbs = entry.get("memory_read_one_core_gbs")
    return view
