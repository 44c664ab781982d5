"""Stand-ins for the fine-tune tests: a node's stream answering the service's asks as
an agent's runner does, and small models and cards."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from llmgw.server.catalog.model import Model
from llmgw.wire.hardware import GPU
from llmgw.wire.messages import Response

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
