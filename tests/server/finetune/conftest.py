"""The fine-tune service over a real SQLite store, with nodes whose streams are
stand-ins (``tests/support/finetunes.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.server.finetune.service import FinetuneService
from llmgw.server.fleet.figures import LiveFigures
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.store import SQLiteStore
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.states import NodeState
from tests.support.finetunes import GIB, AgentEnd, tiny_model


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
