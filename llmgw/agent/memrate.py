"""How fast this node's CPUs read memory, one core and all cores: the figure the
planner's CPU speed estimate rests on (a token reads every weight once).

Measured once per machine, in the background, and kept in the state dir with the CPU
model it was measured on, so a restart does not measure again (a new CPU does). The
measurement sums a buffer well past the caches, several passes, best of; all cores is
that many threads each summing its own slice at once. numpy releases the GIL while it
sums, so the threads run in parallel. They are threads of their own (never the event
loop's executor, which would keep the priority) at the lowest priority, so the engines
and the agent's stream lose nothing to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llmgw.agent.session import HeartbeatFields

log = logging.getLogger("llmgw.agent.memrate")

CACHE_FILE = "memrate.json"
# Well past any desktop or server L3 per core slice, and what the agent may borrow.
BUFFER_BYTES = 256 * 1024 * 1024
PASSES = 4
_VERSION = 1


@dataclass(frozen=True)
class MemoryRate:
    """Memory read rates in GB/s (10^9 bytes a second), and what they were read on."""

    all_cores_gbs: float
    one_core_gbs: float
    threads: int
    cpu_model: str | None
    measured_at: float

    def heartbeat_fields(self) -> HeartbeatFields:
        return {
            "memory_read_gbs": self.all_cores_gbs,
            "memory_read_one_core_gbs": self.one_core_gbs,
        }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name, to tell whether a cached figure is this machine's."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("model name", "cpu model", "hardware") and value.strip():
            return value.strip()
    return None


def _lower_priority() -> None:
    # Linux nices a thread by its own id; elsewhere this is the whole process, which is
    # why it runs only on the measurement's own threads.
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def usable_cpus() -> int:
    """CPUs this process may run on (a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _in_threads(work: list[Callable[[], float]]) -> list[float]:
    """Run each function on its own new thread, at the lowest priority; their results."""
    results = [0.0] * len(work)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        _lower_priority()
        try:
            results[i] = work[i]()
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i,), name=f"llmgw-memrate-{i}", daemon=True)
        for i in range(len(work))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def measure(
    buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES, threads: int | None = None
) -> MemoryRate:
    """Measure now (blocking, a second or two): one core, then ``threads`` at once."""
    count = threads or usable_cpus()
    elements = max(count, buffer_bytes // 8 // count * count)
    buf = np.ones(elements, dtype=np.float64)  # written once: every page is real
    slices = np.split(buf, count)
    barrier = threading.Barrier(count, timeout=60)

    def one_core() -> float:
        best = float("inf")
        for _ in range(passes):
            start = time.perf_counter()
            float(buf.sum())
            best = min(best, time.perf_counter() - start)
        return best

    def part_of_all(part: np.ndarray) -> Callable[[], float]:
        def run() -> float:
            # Each pass starts together; the slowest thread's time is the pass's.
            best = float("inf")
            for _ in range(passes):
                barrier.wait()
                start = time.perf_counter()
                float(part.sum())
                best = min(best, time.perf_counter() - start)
            return best

        return run

    (one_s,) = _in_threads([one_core])
    all_s = max(_in_threads([part_of_all(s) for s in slices]))
    nbytes = buf.nbytes
    one = nbytes / one_s / 1e9
    # Never below one core: more threads than the memory can feed only share it.
    all_cores = max(one, nbytes / all_s / 1e9)
    return MemoryRate(
        all_cores_gbs=round(all_cores, 2),
        one_core_gbs=round(one, 2),
        threads=count,
        cpu_model=cpu_model(),
        measured_at=time.time(),
    )


def load_cached(path: Path, model: str | None, threads: int) -> MemoryRate | None:
    """The figure kept at ``path`` when it was measured on this CPU, else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return None
    if data.get("cpu_model") != model or data.get("threads") != threads:
        return None
    try:
        rate = MemoryRate(
            all_cores_gbs=float(data["all_cores_gbs"]),
            one_core_gbs=float(data["one_core_gbs"]),
            threads=int(data["threads"]),
            cpu_model=data.get("cpu_model"),
            measured_at=float(data["measured_at"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if rate.all_cores_gbs <= 0 or rate.one_core_gbs <= 0:
        return None
    return rate


def save(path: Path, rate: MemoryRate) -> None:
    data: dict[str, object] = {"version": _VERSION, **asdict(rate)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


class MemoryRateProbe:
    """The node's figure: from the cache, else measured once in the background."""

    def __init__(
        self,
        state_dir: Path,
        *,
        measure_fn: Callable[[], MemoryRate] = measure,
        threads: int | None = None,
    ) -> None:
        self.path = Path(state_dir) / CACHE_FILE
        self._measure = measure_fn
        self._threads = threads or usable_cpus()
        self.rate: MemoryRate | None = None
        self.measured = False  # whether this agent measured (rather than read the cache)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin in the background; the figures appear in heartbeats once known."""
        if self._task is None:
            self._task = asyncio.create_task(self.run())

    async def run(self) -> None:
        try:
            self.rate = await self.get()
        except Exception:
            log.exception("measuring the memory read rate failed; CPU speeds stay unknown")

    async def get(self) -> MemoryRate:
        """The cached figure, or a new measurement (saved for the next start)."""
        model = await asyncio.to_thread(cpu_model)
        cached = await asyncio.to_thread(load_cached, self.path, model, self._threads)
        if cached is not None:
            return cached
        # The measurement runs on threads of its own, at the lowest priority.
        rate = await asyncio.to_thread(self._measure)
        self.measured = True
        log.info(
            "memory read rate: %.1f GB/s on all %d cores, %.1f GB/s on one",
            rate.all_cores_gbs,
            rate.threads,
            rate.one_core_gbs,
        )
        try:
            await asyncio.to_thread(save, self.path, rate)
        except OSError as exc:
            log.warning("could not keep the memory read rate in %s: %s", self.path, exc)
        return rate

    def heartbeat_fields(self) -> HeartbeatFields:
        """The memory read rates; none until measured."""
        return self.rate.heartbeat_fields() if self.rate is not None else {}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
