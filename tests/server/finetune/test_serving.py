"""A fine-tune's stored adapter served: the catalog takes ``finetune:NAME`` only for a
fine-tune of that model that succeeded, and a node fetches it from the control plane
over its stream a piece at a time (the real service and the agent's real fetcher, the
stream between them a pair of calls)."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import pytest

from llmgw.agent.finetune.adapters import FinetunedWeights, StoredAdapterError, StoredAdapters
from llmgw.server.finetune.job import FinetuneJob
from llmgw.server.finetune.service import PIECE, stored_row
from llmgw.server.store.values import Audit
from llmgw.wire.messages import AdapterPiece, DownloadProgress, Message
from tests.server.finetune.conftest import Plane
from tests.support.finetunes import sha


async def stored(plane: Plane, name: str, data: bytes, kind: str = "gguf") -> FinetuneJob:
    """A fine-tune of model m that succeeded with ``data``, as the service keeps it."""
    job = FinetuneJob(
        id=f"ft-{name:0>12}"[:15],
        name=name,
        model="m",
        base="hf:org/tiny",
        epochs=1,
        rank=4,
        mib=1000,
        pairs=20,
        created=1.0,
        updated=2.0,
        state="succeeded",
        node="n1",
        adapter_bytes=len(data),
        adapter_sha256=sha(data),
        adapter_kind=kind,
    )
    await plane.store.finetunes.finish(stored_row(job), data, PIECE, Audit("t", "ok", job.id))
    plane.service.jobs[job.id] = job
    return job


class Link:
    """One node's stream: its asks go to the service, the service's pieces come back."""

    def __init__(self, plane: Plane, tmp: Path) -> None:
        self.asks = 0
        self.plane = plane
        self.adapters = StoredAdapters(tmp / "finetuned", self.up, timeout=5)
        plane.node("n1").send = self.down  # type: ignore[attr-defined]

    def up(self, msg: Message) -> None:
        self.asks += 1
        self.plane.service.report("n1", msg)  # type: ignore[arg-type]

    async def down(self, msg: Message) -> None:
        assert isinstance(msg, AdapterPiece)
        self.adapters.piece(msg)


class Weights:
    async def fetch(self, source: str, **kw: object) -> Path:
        return Path("/weights") / source


def progress(_: DownloadProgress) -> None:
    pass


def test_servable_says_why_not(plane: Plane) -> None:
    said = plane.service.servable("m", "nope")
    assert said is not None and "no fine-tune made an adapter 'nope'" in said


async def test_a_node_fetches_a_stored_gguf_in_pieces_once(plane: Plane, tmp_path: Path) -> None:
    data = b"GGUF" + bytes(range(256)) * (PIECE // 256 + 300)  # two pieces
    await stored(plane, "tuned", data)
    assert plane.service.servable("m", "tuned") is None
    assert "trained for m, not other" in (plane.service.servable("other", "tuned") or "")
    link = Link(plane, tmp_path)
    weights = FinetunedWeights(Weights(), link.adapters)
    path = await weights.fetch(
        "finetune:tuned", allow_pickle=False, replica_id="r1", progress=progress
    )
    assert path.name == "adapter.gguf" and path.read_bytes() == data
    assert link.asks == 2
    again = await weights.fetch(
        "finetune:tuned", allow_pickle=False, replica_id="r2", progress=progress
    )
    assert again == path and link.asks == 3  # only the first piece, to learn its sha256
    other = await weights.fetch("hf:org/x", allow_pickle=False, replica_id="r", progress=progress)
    assert other == Path("/weights/hf:org/x")


async def test_a_peft_directory_is_unpacked(plane: Plane, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in (("adapter_config.json", b"{}"), ("adapter_model.safetensors", b"w")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    await stored(plane, "peft", buf.getvalue(), kind="peft-tar")
    path = await Link(plane, tmp_path).adapters.fetch("peft")
    assert path.is_dir() and sorted(p.name for p in path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


async def test_unknown_names_and_a_lost_stream_are_errors(plane: Plane, tmp_path: Path) -> None:
    link = Link(plane, tmp_path)
    with pytest.raises(StoredAdapterError, match="no fine-tune made an adapter 'ghost'"):
        await link.adapters.fetch("ghost")
    quiet = StoredAdapters(tmp_path / "q", lambda msg: None, timeout=30)
    fetching = asyncio.create_task(quiet.fetch("tuned"))
    while not quiet._waiting:
        await asyncio.sleep(0.01)
    quiet.detached()
    with pytest.raises(StoredAdapterError, match="stream to the control plane ended"):
        await fetching
