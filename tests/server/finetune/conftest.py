"""The fine-tune service over a real SQLite store, with nodes whose streams are
stand-ins answering the service's asks as an agent's runner does."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmgw.server.catalog.model import Model
from llmgw.server.finetune.service import FinetuneService
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.registry import NodeView
from llmgw.server.store import SQLiteStore
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.messages import Response
from llmgw.wire.states import NodeState

GIB = 1024**3


@dataclass
class AgentEnd:
    """A node's stream as the service sees it: records every ask, answers as the runner."""

    asks: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    data: dict[str, bytearray] = field(default_factory=dict)
    adapters: dict[str, bytes] = field(default_factory=dict)
    # Changes a piece on its way (a damaged transfer).
    damage: Callable[[bytes], bytes] = lambda piece: piece
    refuse: str | None = None

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        self.asks.append((kind, args))
        if self.refuse is not None:
            yield Response(id="x", ok=False, error=self.refuse)
            return
        result: object = {"ok": True}
        if kind == "finetune.data":
            got = self.data.setdefault(args["id"], bytearray())
            assert args["at"] == len(got)
            got.extend(args["data"])
        elif kind == "finetune.piece":
            at = args["at"]
            result = self.damage(self.adapters[args["id"]][at : at + 1024 * 1024])
        yield Response(id="x", result=result)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.asks]


@dataclass
class Plane:
    service: FinetuneService
    store: SQLiteStore
    nodes: dict[str, NodeView]
    ends: dict[str, AgentEnd]
    clock: list[float]
    interval: float = 1.0
    missed: int = 3

    def node(self, name: str, gpus: list[GPU] | None = None, ram: int = 32 * GIB) -> AgentEnd:
        end = AgentEnd()
        facts = HostFacts(hostname=name, os="linux", arch="x86_64", memory_available=ram)
        view = NodeView(id=name, cert_serial=1, state=NodeState.READY, facts=facts)
        view.live = LiveFigures(memory_available=ram, gpus=gpus)
        view.session = end  # type: ignore[assignment]
        self.nodes[name], self.ends[name] = view, end
        return end


def tiny_model(name: str = "m", source: str = "hf:org/tiny", engine: str = "llama.cpp") -> Model:
    return Model(name=name, source=source, engine=engine, profiles=(), context=2048)


def card(uuid: str, free_gib: int, total_gib: int = 80) -> GPU:
    return GPU(
        index=0,
        uuid=uuid,
        name="NVIDIA H100",
        memory_total=total_gib * GIB,
        memory_used=(total_gib - free_gib) * GIB,
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    store = SQLiteStore(tmp_path / "ft.db")
    await store.open()
    models = {"m": tiny_model(), "g": tiny_model("g", "hf:org/tiny-GGUF:Q4_K_M")}
    clock = [1000.0]
    p = Plane(None, store, {}, {}, clock)  # type: ignore[arg-type]
    p.service = FinetuneService(store, p, lambda: models, clock=lambda: clock[0])
    try:
        yield p
    finally:
        await store.close()
