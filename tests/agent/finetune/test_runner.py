"""The node's runner against a stand-in trainer: a script that prints the trainer
contract's lines (start, steps with a loss, saved, converted, error) and writes the
files a real one writes. What goes up the stream is read as the control plane would."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import tarfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from llmgw.agent.finetune.runner import PIECE, FinetuneRunner
from llmgw.agent.weights.fetch import ProgressCallback
from llmgw.wire.codec import to_map
from llmgw.wire.messages import FinetuneSpec, FinetuneStatus, Message, Request, Response

STANDIN = r"""
import json, os, sys, time, subprocess
spec = json.load(open(sys.argv[1]))
mode = os.environ.get("STANDIN_MODE", "ok")
def say(**kw):
    print(json.dumps(kw), flush=True)
print("libraries chatter on stderr", file=sys.stderr)
lines = [l for l in open(spec["data"]) if l.strip()]
say(event="start", steps=3, pairs=len(lines))
if mode == "crash":
    print("Traceback: CUDA out of memory", file=sys.stderr)
    sys.exit(3)
for i, loss in enumerate([2.5, 1.75, 1.0], 1):
    say(event="step", step=i, loss=loss, peak_mib=100.0 * i)
    if mode == "hang":
        with open(os.path.join(spec["out"], "..", "child.pid"), "w") as f:
            f.write(str(subprocess.Popen(["sleep", "300"]).pid))
        time.sleep(300)
if mode == "refuse":
    say(event="error", reason="line 2: no completion")
    sys.exit(1)
adapter = os.path.join(spec["out"], "adapter")
os.makedirs(adapter)
config = {"r": spec["rank"], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}
open(os.path.join(adapter, "adapter_config.json"), "w").write(json.dumps(config))
open(os.path.join(adapter, "adapter_model.safetensors"), "wb").write(b"\x01" * 3000)
say(event="saved", dir=adapter)
if spec["convert"]:
    gguf = os.path.join(spec["out"], "adapter.gguf")
    open(gguf, "wb").write(b"GGUF" + bytes(range(256)) * 9000)
    say(event="converted", gguf=gguf)
"""
PAIRS = b'{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d"}\n'


class Kit:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    async def python(self, progress: Callable[[str], None]) -> Path:
        progress("trainer environment ready")
        return Path(sys.executable)

    async def converter(self, progress: Callable[[str], None]) -> Path:
        return self.tmp / "convert_lora_to_gguf.py"

    def script(self) -> bytes:
        return STANDIN.encode()


class Weights:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.fetched: list[str] = []

    async def fetch(
        self, source: str, *, allow_pickle: bool, replica_id: str, progress: ProgressCallback
    ) -> Path:
        self.fetched.append(source)
        base = self.tmp / "base"
        base.mkdir(exist_ok=True)
        return base


class Stream:
    def __init__(self) -> None:
        self.said: list[Message] = []
        self.new = asyncio.Event()

    def __call__(self, msg: Message) -> None:
        self.said.append(msg)
        self.new.set()

    def statuses(self) -> list[FinetuneStatus]:
        return [m for m in self.said if isinstance(m, FinetuneStatus)]

    async def until(self, state: str) -> FinetuneStatus:
        async with asyncio.timeout(30):
            while True:
                found = [s for s in self.statuses() if s.state == state]
                if found:
                    return found[-1]
                self.new.clear()
                await self.new.wait()


def spec(data: bytes = PAIRS, convert: bool = True, **kw: object) -> FinetuneSpec:
    fields: dict[str, object] = {
        "id": "ft-0123456789ab",
        "name": "tuned",
        "model": "m",
        "base": "hf:org/tiny",
        "epochs": 1,
        "rank": 4,
        "device": "cpu",
        "data_bytes": len(data),
        "data_sha256": hashlib.sha256(data).hexdigest(),
        "pairs": 2,
        "convert": convert,
    }
    fields.update(kw)
    return FinetuneSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[FinetuneRunner, Stream, Weights]]:
    stream = Stream()
    weights = Weights(tmp_path)
    runner = FinetuneRunner(tmp_path / "finetunes", weights, Kit(tmp_path), stream)
    runner.attach(True)
    try:
        yield runner, stream, weights
    finally:
        await runner.close()


async def ask(runner: FinetuneRunner, stream: Stream, kind: str, **args: object) -> Response:
    await runner.answer(Request(id=f"r{len(stream.said)}", kind=kind, args=dict(args)))
    answer = stream.said[-1]
    assert isinstance(answer, Response)
    return answer


async def send(runner: FinetuneRunner, stream: Stream, job: FinetuneSpec, data: bytes) -> Response:
    for at in range(0, len(data), 40):
        got = await ask(runner, stream, "finetune.data", id=job.id, at=at, data=data[at : at + 40])
        assert got.ok, got.error
    return await ask(runner, stream, "finetune.start", spec=to_map(job))


def losses(stream: Stream) -> list[float]:
    """The losses as the control plane puts them together (loss_at, loss)."""
    known: list[float] = []
    for s in stream.statuses():
        known = known[: s.loss_at] + list(s.loss)
    return known


async def test_a_job_trains_converts_and_its_adapter_is_taken_in_pieces(
    node: tuple[FinetuneRunner, Stream, Weights],
) -> None:
    runner, stream, weights = node
    job = spec()
    assert (await send(runner, stream, job, PAIRS)).ok
    ready = await stream.until("uploading")
    assert weights.fetched == ["hf:org/tiny"]
    seen = [s.state for s in stream.statuses()]
    assert seen.index("preparing") < seen.index("training") < seen.index("converting")
    assert losses(stream) == [2.5, 1.75, 1.0]
    assert ready.steps == 3 and ready.adapter_kind == "gguf" and ready.peak_mib == 300.0
    size = ready.adapter_bytes
    assert size is not None and size > PIECE
    pieces = []
    for at in range(0, size, PIECE):
        got = await ask(runner, stream, "finetune.piece", id=job.id, at=at)
        assert got.ok and isinstance(got.result, bytes)
        pieces.append(got.result)
    whole = b"".join(pieces)
    assert hashlib.sha256(whole).hexdigest() == ready.adapter_sha256
    assert whole.startswith(b"GGUF")
    # the trainer's spec: the base as fetched, the CPU with no card visible
    written = json.loads((runner.root / job.id / "spec.json").read_text())
    assert written["convert"].endswith("convert_lora_to_gguf.py") and written["device"] == "cpu"
    assert "libraries chatter" in (runner.root / job.id / "trainer.log").read_text()
    assert (await ask(runner, stream, "finetune.forget", id=job.id)).ok
    assert not (runner.root / job.id).exists() and runner.jobs == {}


async def test_unconverted_adapter_is_the_peft_directory_as_a_tar(
    node: tuple[FinetuneRunner, Stream, Weights], tmp_path: Path
) -> None:
    runner, stream, _ = node
    job = spec(convert=False, device="cuda", cards=["GPU-b"])
    assert (await send(runner, stream, job, PAIRS)).ok
    ready = await stream.until("uploading")
    assert ready.adapter_kind == "peft-tar" and "converting" not in [
        s.state for s in stream.statuses()
    ]
    got = await ask(runner, stream, "finetune.piece", id=job.id, at=0)
    (tmp_path / "a.tar").write_bytes(got.result)
    with tarfile.open(tmp_path / "a.tar") as tar:
        assert sorted(tar.getnames()) == ["adapter_config.json", "adapter_model.safetensors"]
        config = json.load(tar.extractfile("adapter_config.json"))  # type: ignore[arg-type]
    assert config["cuda"] == "GPU-b" and config["r"] == 4


@pytest.mark.parametrize(
    ("mode", "said"),
    [("refuse", "line 2: no completion"), ("crash", "exited 3 (libraries chatter on stderr | ")],
)
async def test_a_trainer_that_fails_says_why(
    node: tuple[FinetuneRunner, Stream, Weights],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    said: str,
) -> None:
    runner, stream, _ = node
    monkeypatch.setenv("STANDIN_MODE", mode)
    await send(runner, stream, spec(), PAIRS)
    failed = await stream.until("failed")
    assert said in (failed.error or "")
    if mode == "crash":
        assert "CUDA out of memory" in (failed.error or "")


async def test_cancel_kills_the_trainers_process_group(
    node: tuple[FinetuneRunner, Stream, Weights], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, stream, _ = node
    monkeypatch.setenv("STANDIN_MODE", "hang")
    job = spec()
    await send(runner, stream, job, PAIRS)
    await stream.until("training")
    marker = runner.root / job.id / "child.pid"
    async with asyncio.timeout(20):
        while not marker.exists() or not marker.read_text():
            await asyncio.sleep(0.05)
    child = int(marker.read_text())
    assert (await ask(runner, stream, "finetune.cancel", id=job.id)).ok
    assert stream.statuses()[-1].state == "cancelled"
    assert "failed" not in [s.state for s in stream.statuses()]
    async with asyncio.timeout(10):
        while _alive(child):
            await asyncio.sleep(0.05)
    # the node is free for the next job
    assert (await send(runner, stream, spec(id="ft-0123456789ac"), PAIRS)).ok


async def test_refusals(node: tuple[FinetuneRunner, Stream, Weights]) -> None:
    runner, stream, _ = node
    damaged = await send(runner, stream, spec(data=PAIRS + b"x"), PAIRS)
    assert not damaged.ok and "unlike the" in (damaged.error or "")
    gap = await ask(runner, stream, "finetune.data", id="ft-0123456789ab", at=999, data=b"x")
    assert not gap.ok and "pairs piece at 999" in (gap.error or "")
    bad = await ask(runner, stream, "finetune.data", id="../etc", at=0, data=b"x")
    assert not bad.ok and "not a fine-tune id" in (bad.error or "")
    none = await ask(runner, stream, "finetune.piece", id="ft-0123456789ab", at=0)
    assert not none.ok


async def test_a_new_stream_is_told_every_job_whole(
    node: tuple[FinetuneRunner, Stream, Weights],
) -> None:
    runner, stream, _ = node
    await send(runner, stream, spec(), PAIRS)
    await stream.until("uploading")
    runner.attach(False)
    stream.said.clear()
    runner.attach(True)
    again = stream.statuses()
    assert len(again) == 1 and again[0].loss_at == 0 and again[0].loss == [2.5, 1.75, 1.0]
    assert again[0].state == "uploading"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its parent) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


async def test_each_heartbeat_carries_a_live_jobs_word(
    node: tuple[FinetuneRunner, Stream, Weights], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, stream, _ = node
    monkeypatch.setenv("STANDIN_MODE", "hang")
    job = spec()
    await send(runner, stream, job, PAIRS)
    await stream.until("training")
    before = len(stream.statuses())
    runner.beat()
    runner.beat()
    assert len(stream.statuses()) == before + 2
    assert stream.statuses()[-1].state == "training"
    await ask(runner, stream, "finetune.cancel", id=job.id)
    said = len(stream.statuses())
    runner.beat()  # an ended job is said on a new stream, not with every beat
    assert len(stream.statuses()) == said
