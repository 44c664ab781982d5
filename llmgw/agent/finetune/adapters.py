"""Fine-tunes' stored adapters on this node: a shard's LoRA adapter whose source is
``finetune:NAME``, fetched from the control plane over the agent's stream.

The node asks a piece at a time (``AdapterAsk``: the name and a byte offset) and the
control plane answers each with up to 1 MiB (``AdapterPiece``) and the whole file's
size, sha256 and kind; the file is checked against that sha256 before it is used. A
GGUF is kept as ``{root}/{NAME}-{SHA16}/adapter.gguf``; a PEFT directory (sent as a
tar) is unpacked into ``{root}/{NAME}-{SHA16}/adapter/``, regular files only, none
leaving it. The same adapter (same sha256) is fetched once and kept.

``FinetunedWeights`` is the weights fetcher the supervisor is given: ``finetune:``
sources here, every other source to the weights cache as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import shutil
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path

from llmgw.agent.weights.fetch import Fetcher, ProgressCallback
from llmgw.modelkit.finetuned import finetune_name
from llmgw.modelkit.sources import WeightsError
from llmgw.wire.messages import AdapterAsk, AdapterPiece, Message

# Seconds the control plane has to answer one piece.
ASK_TIMEOUT = 60.0
DONE = ".complete"


class StoredAdapterError(WeightsError):
    """A fine-tune's adapter that could not be fetched, and why."""


class StoredAdapters:
    def __init__(
        self, root: Path, emit: Callable[[Message], None], timeout: float = ASK_TIMEOUT
    ) -> None:
        self.root = root
        self.emit = emit
        self.timeout = timeout
        self._waiting: dict[str, asyncio.Future[AdapterPiece]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def piece(self, msg: AdapterPiece) -> None:
        """An answer from the control plane (the runtime's hook)."""
        waiter = self._waiting.pop(msg.ask_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)

    def detached(self) -> None:
        """The stream is gone: no answer comes to what was asked on it."""
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(
                    StoredAdapterError("the stream to the control plane ended while fetching")
                )
        self._waiting.clear()

    async def _ask(self, name: str, at: int) -> AdapterPiece:
        ask_id = secrets.token_hex(8)
        waiter: asyncio.Future[AdapterPiece] = asyncio.get_running_loop().create_future()
        self._waiting[ask_id] = waiter
        self.emit(AdapterAsk(ask_id=ask_id, name=name, at=at))
        try:
            async with asyncio.timeout(self.timeout):
                answer = await waiter
        except TimeoutError:
            raise StoredAdapterError(
                f"the control plane did not answer for fine-tune {name!r} in {self.timeout:g} s"
            ) from None
        finally:
            self._waiting.pop(ask_id, None)
        if answer.error:
            raise StoredAdapterError(f"fine-tune adapter {name!r}: {answer.error}")
        return answer

    async def fetch(self, name: str) -> Path:
        """The adapter's local path: the GGUF file, or the PEFT directory."""
        first = await self._ask(name, 0)
        total, digest, kind = first.total, first.sha256, first.kind
        if total is None or digest is None or kind not in ("gguf", "peft-tar"):
            raise StoredAdapterError(f"fine-tune adapter {name!r}: the answer said no size")
        home = self.root / f"{name}-{digest[:16]}"
        found = home / ("adapter.gguf" if kind == "gguf" else "adapter")
        async with self._locks.setdefault(str(home), asyncio.Lock()):
            if (home / DONE).exists() and found.exists():
                return found
            parts = [first.data]
            at = len(first.data)
            while at < total:
                piece = await self._ask(name, at)
                if not piece.data:
                    raise StoredAdapterError(f"fine-tune adapter {name!r}: empty piece at {at}")
                parts.append(piece.data)
                at += len(piece.data)
            data = b"".join(parts)
            if len(data) != total or hashlib.sha256(data).hexdigest() != digest:
                raise StoredAdapterError(
                    f"fine-tune adapter {name!r} arrived damaged ({len(data):,} bytes, not "
                    f"{total:,} with sha256 {digest[:12]})"
                )
            await asyncio.to_thread(_keep, home, kind, data)
        return found


def _keep(home: Path, kind: str, data: bytes) -> None:
    staging = home.with_name(f".{home.name}.making")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if kind == "gguf":
        (staging / "adapter.gguf").write_bytes(data)
    else:
        tar_path = staging / "adapter.tar"
        tar_path.write_bytes(data)
        target = staging / "adapter"
        target.mkdir()
        with tarfile.open(tar_path) as tar:
            for member in tar.getmembers():
                if not member.isfile() or "/" in member.name or member.name.startswith("."):
                    raise StoredAdapterError(
                        f"the adapter's tar holds {member.name!r}: only plain files are taken"
                    )
                source = tar.extractfile(member)
                assert source is not None
                (target / member.name).write_bytes(source.read())
        tar_path.unlink()
    (staging / DONE).write_text("")
    shutil.rmtree(home, ignore_errors=True)
    staging.rename(home)


class FinetunedWeights:
    """The supervisor's weights fetcher: ``finetune:NAME`` from the control plane, the
    rest from the weights cache."""

    def __init__(self, weights: Fetcher, stored: StoredAdapters) -> None:
        self.weights = weights
        self.stored = stored

    async def fetch(
        self,
        source: str,
        *,
        allow_pickle: bool,
        replica_id: str,
        progress: ProgressCallback,
        vouched: Mapping[str, str] | None = None,
        hub: str | None = None,
    ) -> Path:
        try:
            name = finetune_name(source)
        except ValueError as exc:
            raise StoredAdapterError(str(exc)) from None
        if name is not None:
            return await self.stored.fetch(name)
        return await self.weights.fetch(
            source,
            allow_pickle=allow_pickle,
            replica_id=replica_id,
            progress=progress,
            vouched=vouched,
            hub=hub,
        )
