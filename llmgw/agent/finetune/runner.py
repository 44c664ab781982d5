"""The node's side of a fine-tune job: ``FinetuneRunner`` answers the control plane's
``finetune.*`` requests and runs the trainer.

The control plane sends the pairs in pieces (``finetune.data``: each at the offset the
file has reached), then the job (``finetune.start``: a ``FinetuneSpec``); the runner
checks the pairs against the spec's size and sha256 and refuses a second job while
one trains. Then, in the background: the base weights fetched by the weights fetcher
(as any source: cached, resumed, verified), the trainer's environment made
(``Toolkit.python``, D1's ``trainenv.ensure_env``), llama.cpp's conversion script where
the adapter is to be a GGUF, and the trainer (``trainer.py``, copied into the job's
directory) run as ``PYTHON trainer.py SPEC.json`` as the engines' user, in a session of
its own, on the cards the spec names (``CUDA_VISIBLE_DEVICES``). Its stdout is one JSON
event a line (start, step, saved, converted, error), each turned into a
``FinetuneStatus``; its stderr goes to ``trainer.log`` in the job's directory, whose
last lines say why when it dies without an ``error`` event.

The result is one file: ``adapter.gguf``, or ``adapter.tar`` (the PEFT directory) when
not converted; the status says ``uploading`` with its size and sha256, and the control
plane takes it in pieces (``finetune.piece``), then says ``finetune.forget``, and the
job's directory goes. ``finetune.cancel`` kills the trainer's process group.

Every job's status goes up again, whole, on each new stream (``attach``), and with
every heartbeat while it runs (``beat``), so a control plane that just started leading
knows it and one that hears nothing of a job for its node timeout knows it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import tarfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from llmgw.agent.weights.fetch import Fetcher
from llmgw.jsonvalue import JSON, JSONObject
from llmgw.modelkit.sources import WeightsError
from llmgw.wire.codec import MessageError, from_map
from llmgw.wire.messages import FinetuneSpec, FinetuneStatus, Message, Request, Response

log = logging.getLogger("llmgw.agent.finetune")

PIECE = 1024 * 1024
# A step's status waits this long for the next step's, so a fast trainer is one
# message a second, not one a step.
STEP_EVERY = 1.0
LOG_LINES = 20
KINDS = frozenset(
    {"finetune.data", "finetune.start", "finetune.cancel", "finetune.piece", "finetune.forget"}
)


class Toolkit(Protocol):
    """What the trainer needs beside the job (``trainenv``): its environment's Python,
    llama.cpp's ``convert_lora_to_gguf.py``, and the script itself."""

    async def python(self, progress: Callable[[str], None]) -> Path: ...

    async def converter(self, progress: Callable[[str], None]) -> Path: ...

    def script(self) -> bytes: ...


@dataclass
class Job:
    spec: FinetuneSpec
    directory: Path
    state: str = "preparing"
    step: int | None = None
    steps: int | None = None
    loss: list[float] = field(default_factory=list)
    peak_mib: float | None = None
    error: str | None = None
    doing: str | None = None
    result: Path | None = None
    adapter_bytes: int | None = None
    adapter_sha256: str | None = None
    adapter_kind: str | None = None
    # How many losses this stream has been told.
    told: int = 0
    said_at: float = 0.0
    task: asyncio.Task[None] | None = None
    proc: asyncio.subprocess.Process | None = None
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))

    @property
    def running(self) -> bool:
        return self.state in ("preparing", "training", "converting")


class FinetuneRunner:
    def __init__(
        self,
        root: Path,
        weights: Fetcher,
        toolkit: Toolkit,
        emit: Callable[[Message], None],
        engine_user: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.weights = weights
        self.toolkit = toolkit
        self.emit = emit
        self.engine_user = engine_user
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        self._connected = False

    # --- the session ------------------------------------------------------------------

    def attach(self, connected: bool) -> None:
        """A new stream (or none): every job is told again, whole, on it."""
        self._connected = connected
        for job in self.jobs.values():
            job.told = 0
            if connected:
                self._say(job)

    async def close(self) -> None:
        for job in self.jobs.values():
            await self._stop(job)

    async def answer(self, req: Request) -> None:
        """One ``finetune.*`` request, answered (an error in words when refused)."""
        try:
            result = await self._answer(req)
        except (FinetuneRefused, MessageError, OSError) as exc:
            self.emit(Response(id=req.id, ok=False, error=str(exc)))
            return
        self.emit(Response(id=req.id, result=result))

    async def _answer(self, req: Request) -> object:
        args = req.args
        job_id = str(args.get("id") or "")
        if req.kind == "finetune.start":
            return self._start(from_map(FinetuneSpec, dict(args.get("spec") or {})))
        if req.kind == "finetune.data":
            return await self._data(job_id, int(args.get("at", -1)), args.get("data"))
        job = self.jobs.get(job_id)
        if req.kind == "finetune.piece":
            return await self._piece(job, int(args.get("at", -1)))
        if job is None:
            return {"known": False}
        if req.kind == "finetune.cancel":
            if job.running:
                job.state, job.doing = "cancelled", None
                await self._stop(job)
                self._say(job)
        elif req.kind == "finetune.forget":
            await self._stop(job)
            del self.jobs[job_id]
            await asyncio.to_thread(shutil.rmtree, job.directory, True)
        return {"known": True}

    # --- receiving a job --------------------------------------------------------------

    def _dir(self, job_id: str) -> Path:
        if not job_id.startswith("ft-") or not job_id[3:].isalnum():
            raise FinetuneRefused(f"{job_id!r} is not a fine-tune id")
        return self.root / job_id

    async def _data(self, job_id: str, at: int, data: object) -> object:
        if not isinstance(data, bytes):
            raise FinetuneRefused("finetune.data carries no bytes")
        path = self._dir(job_id) / "pairs.jsonl"
        if at == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
        have = path.stat().st_size if path.exists() else -1
        if at != have:
            raise FinetuneRefused(f"pairs piece at {at}, but {max(have, 0)} bytes are here")
        with path.open("ab") as out:
            out.write(data)
        return {"have": at + len(data)}

    def _start(self, spec: FinetuneSpec) -> object:
        directory = self._dir(spec.id)
        busy = [j.spec.id for j in self.jobs.values() if j.running]
        if busy:
            raise FinetuneRefused(f"this node is already training {busy[0]}")
        if spec.id in self.jobs:
            raise FinetuneRefused(f"{spec.id} was started here already")
        pairs = directory / "pairs.jsonl"
        data = pairs.read_bytes() if pairs.exists() else b""
        if len(data) != spec.data_bytes or hashlib.sha256(data).hexdigest() != spec.data_sha256:
            raise FinetuneRefused(
                f"the pairs arrived as {len(data):,} bytes unlike the {spec.data_bytes:,} "
                "sent (or with another sha256); send the job again"
            )
        job = self.jobs[spec.id] = Job(spec, directory)
        job.task = asyncio.create_task(self._run(job))
        return {"started": True}

    # --- running it -------------------------------------------------------------------

    async def _run(self, job: Job) -> None:
        try:
            await self._train(job)
        except asyncio.CancelledError:
            raise
        except (WeightsError, OSError, RuntimeError, ValueError) as exc:
            self._failed(job, str(exc))
        except Exception as exc:
            log.exception("fine-tune %s failed unexpectedly", job.spec.id)
            self._failed(job, f"{type(exc).__name__}: {exc}")

    async def _train(self, job: Job) -> None:
        spec, toolkit = job.spec, self.toolkit

        def doing(words: str) -> None:
            job.doing = words
            self._say(job, soon=True)

        doing(f"fetching the base weights {spec.base}")
        model_dir = await self.weights.fetch(
            spec.base,
            allow_pickle=spec.allow_pickle,
            replica_id=spec.id,
            progress=lambda *_: None,
        )
        doing("making the trainer's environment")
        python = await toolkit.python(doing)
        convert = await toolkit.converter(doing) if spec.convert else None
        out = job.directory / "out"
        out.mkdir(parents=True, exist_ok=True)
        script = job.directory / "trainer.py"
        script.write_bytes(toolkit.script())
        trainer_spec = {
            "model_dir": str(model_dir),
            "data": str(job.directory / "pairs.jsonl"),
            "out": str(out),
            "epochs": spec.epochs,
            "rank": spec.rank,
            "alpha": None,
            "lr": None,
            "max_len": None,
            "device": spec.device,
            "convert": str(convert) if convert else None,
            "seed": spec.seed,
        }
        (job.directory / "spec.json").write_text(json.dumps(trainer_spec, indent=2))
        if self.engine_user:
            for path in (job.directory, out, *job.directory.iterdir()):
                shutil.chown(path, self.engine_user)
        if job.state != "preparing":
            return  # cancelled meanwhile
        doing("starting the trainer")
        await self._trainer(job, python, script)

    async def _trainer(self, job: Job, python: Path, script: Path) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if job.spec.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(job.spec.cards)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
        job.proc = proc = await asyncio.create_subprocess_exec(
            str(python),
            str(script),
            str(job.directory / "spec.json"),
            cwd=job.directory,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
            user=self.engine_user,
        )
        assert proc.stdout is not None and proc.stderr is not None
        logs = asyncio.create_task(self._stderr(job, proc.stderr))
        reason: str | None = None
        async for raw in proc.stdout:
            event = _event(raw)
            if event is not None:
                reason = self._on(job, event) or reason
        code = await proc.wait()
        await asyncio.gather(logs, return_exceptions=True)
        if job.state == "cancelled":
            return
        if code != 0 or reason is not None:
            tail = " | ".join(job.stderr) or "nothing on stderr"
            why = reason or f"the trainer exited {code} ({tail})"
            self._failed(job, why)
            return
        await self._result(job)

    def _on(self, job: Job, event: JSONObject) -> str | None:
        """A trainer event; the reason it gave when it is an error."""
        kind = event.get("event")
        if kind == "start":
            job.state, job.doing = "training", None
            job.steps = _int(event.get("steps"))
            self._say(job)
        elif kind == "step":
            job.step = _int(event.get("step"))
            loss, peak = event.get("loss"), event.get("peak_mib")
            if isinstance(loss, int | float):
                job.loss.append(float(loss))
            if isinstance(peak, int | float):
                job.peak_mib = float(peak)
            self._say(job, soon=True)
        elif kind == "saved" and job.spec.convert:
            job.state, job.doing = "converting", "converting the adapter to GGUF"
            self._say(job)
        elif kind == "error":
            return str(event.get("reason") or "the trainer failed")
        return None

    async def _stderr(self, job: Job, stream: asyncio.StreamReader) -> None:
        with (job.directory / "trainer.log").open("ab") as out:
            async for raw in stream:
                out.write(raw)
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    job.stderr.append(line[:300])

    async def _result(self, job: Job) -> None:
        out = job.directory / "out"
        if job.spec.convert:
            path, kind = out / "adapter.gguf", "gguf"
            if not path.is_file():
                raise RuntimeError("the trainer finished without writing adapter.gguf")
        else:
            path, kind = job.directory / "adapter.tar", "peft-tar"
            adapter = out / "adapter"
            if not (adapter / "adapter_config.json").is_file():
                raise RuntimeError("the trainer finished without the PEFT adapter directory")
            await asyncio.to_thread(_tar, adapter, path)
        job.result = path
        job.adapter_bytes = path.stat().st_size
        job.adapter_sha256 = await asyncio.to_thread(_sha256, path)
        job.adapter_kind = kind
        job.state, job.doing = "uploading", "waiting for the control plane to take the adapter"
        self._say(job)

    async def _piece(self, job: Job | None, at: int) -> bytes:
        if job is None or job.result is None:
            raise FinetuneRefused("no adapter is ready for that fine-tune here")
        size = job.adapter_bytes or 0
        if not 0 <= at < size:
            raise FinetuneRefused(f"no piece at {at}: the adapter is {size:,} bytes")

        def read() -> bytes:
            assert job.result is not None
            with job.result.open("rb") as f:
                f.seek(at)
                return f.read(PIECE)

        return await asyncio.to_thread(read)

    async def _stop(self, job: Job) -> None:
        proc = job.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if job.task is not None and not job.task.done():
            if job.proc is None:
                job.task.cancel()
            await asyncio.gather(job.task, return_exceptions=True)

    # --- saying it --------------------------------------------------------------------

    def _failed(self, job: Job, reason: str) -> None:
        if job.state == "cancelled":
            return
        log.warning("fine-tune %s failed: %s", job.spec.id, reason)
        job.state, job.error, job.doing = "failed", reason, None
        self._say(job)

    def _say(self, job: Job, soon: bool = False) -> None:
        """The job's status up the stream; with ``soon``, only if a second has passed."""
        now = self.clock()
        if not self._connected or (soon and now - job.said_at < STEP_EVERY):
            return
        job.said_at = now
        self.emit(
            FinetuneStatus(
                id=job.spec.id,
                state=job.state,
                step=job.step,
                steps=job.steps,
                pairs=job.spec.pairs,
                loss_at=job.told,
                loss=job.loss[job.told :],
                peak_mib=job.peak_mib,
                error=job.error,
                adapter_bytes=job.adapter_bytes,
                adapter_sha256=job.adapter_sha256,
                adapter_kind=job.adapter_kind,
                doing=job.doing,
            )
        )
        job.told = len(job.loss)

    def beat(self) -> None:
        """A heartbeat goes up: each live job's status goes with it (what a step said
        since included), so the control plane hears of a job as often as of its node."""
        for job in list(self.jobs.values()):
            if job.running or job.state == "uploading":
                self._say(job)


class FinetuneRefused(Exception):
    """A request the runner will not do, in words for the control plane."""


def _event(raw: bytes) -> JSONObject | None:
    """One line of the trainer's stdout: an event object, or None for anything else."""
    try:
        event: JSON = json.loads(raw)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tar(directory: Path, path: Path) -> None:
    with tarfile.open(path, "w") as tar:
        for item in sorted(directory.iterdir()):
            if item.is_file():
                tar.add(item, arcname=item.name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
