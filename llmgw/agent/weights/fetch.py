"""Fetching a source into the cache: single flight, resumable, verified, atomic.

``WeightStore.fetch`` is what the supervisor calls before it starts an engine. Every
shard waiting on one source waits on one download; each progress report names them all.
A file is written as ``NAME.part`` and takes its final name only once its size and
(where the hub publishes one) sha256 are right; the source is marked complete last, so
a fetch after a restart costs a stat a file. An interrupted download resumes with
``Range`` from the part's size; a server that answers a Range with 200 is starting over,
and so do we.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from llmgw.agent.weights.cache import (
    PART_SUFFIX,
    CacheLocks,
    FileRecord,
    Manifest,
    append_block,
    drop_part,
    is_whole,
    load_complete,
    open_part,
    prepare_directory,
    publish,
    resume_point,
    write_manifest,
)
from llmgw.agent.weights.errors import (
    ChecksumError,
    DiskSpaceError,
    HubError,
    NetworkError,
    SourceError,
)
from llmgw.agent.weights.inventory import CachedSource, CollectResult, Inventory
from llmgw.modelkit.hub import HubClient, select_files
from llmgw.modelkit.sources import (
    Source,
    cache_name,
    check_named_pickle,
    is_pickled,
    parse_source,
    pickle_refusal,
)
from llmgw.wire.messages import DownloadProgress

log = logging.getLogger(__name__)

ProgressCallback = Callable[[DownloadProgress], None]


class Fetcher(Protocol):
    """What fetches a source's weights to this node (``WeightStore``, or the supervisor's
    ``FinetunedWeights`` over it): the local path of ``source``."""

    async def fetch(
        self,
        source: str,
        *,
        allow_pickle: bool,
        replica_id: str,
        progress: ProgressCallback,
        vouched: Mapping[str, str] | None = None,
        hub: str | None = None,
    ) -> Path: ...


class DiskFree(Protocol):
    @property
    def free(self) -> int: ...


DiskUsage = Callable[[Path], DiskFree]


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit} ({n} bytes)"
        size /= 1024
    raise AssertionError("unreachable")


@dataclass(eq=False)
class _Waiter:
    replica_id: str
    allow_pickle: bool
    progress: ProgressCallback


@dataclass(eq=False)
class _Flight:
    name: str
    source: Source
    given: str  # the source as the first caller wrote it: what progress reports name
    waiters: list[_Waiter]
    task: asyncio.Task[Manifest] | None = None
    # sha256 the control plane vouches for, by path in the repository: over the hub's.
    vouched: Mapping[str, str] = field(default_factory=dict)
    # The hub to list and fetch from (a mirror the control plane named); None: ours.
    hub: str | None = None


@dataclass(frozen=True)
class _Item:
    """One file to fetch: where from, where to, and what the hub says it is."""

    path: str
    url: str
    size: int | None
    sha256: str | None
    repo: str | None = None


@dataclass
class _Reporter:
    """Progress of one flight: about once per ``interval``, and a final report."""

    flight: _Flight
    total: int | None
    interval: float
    clock: Callable[[], float]
    held: dict[str, int] = field(default_factory=dict)  # bytes on disk, by file
    file: str | None = None
    _last: float | None = field(default=None, repr=False)

    def _emit(self, *, finished: bool = False, error: str | None = None) -> None:
        waiters = list(self.flight.waiters)
        report = DownloadProgress(
            source=self.flight.given,
            replica_ids=list(dict.fromkeys(w.replica_id for w in waiters)),
            done=sum(self.held.values()),
            total=self.total,
            file=self.file,
            finished=finished,
            error=error,
        )
        # Shards usually hand in the same sender; it gets one report, not one a shard.
        called: list[ProgressCallback] = []
        for waiter in waiters:
            if any(waiter.progress == seen for seen in called):
                continue
            called.append(waiter.progress)
            try:
                waiter.progress(report)
            except Exception:
                log.exception("progress callback for %s failed", self.flight.given)

    def tick(self, *, force: bool = False) -> None:
        now = self.clock()
        if force or self._last is None or now - self._last >= self.interval:
            self._last = now
            self._emit()

    def finish(self) -> None:
        self.file = None
        self._emit(finished=True)

    def fail(self, error: str) -> None:
        self._emit(error=error)


class WeightStore:
    """The node's weights cache: fetches sources into it, lists it, collects from it."""

    def __init__(
        self,
        cache_dir: Path,
        hub: HubClient,
        *,
        disk_usage: DiskUsage = shutil.disk_usage,
        revision: str = "main",
        retries: int = 2,
        retry_delay: float = 1.0,
        progress_interval: float = 1.0,
        chunk_size: int = 1 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.hub = hub
        # Mirrors the control plane named for a shard (ShardSpec.hub), by endpoint.
        self._mirrors: dict[str, HubClient] = {}
        self._disk_usage = disk_usage
        self._revision = revision
        # Retries of a cut connection within one fetch, each resuming where it stopped.
        self._retries = retries
        self._retry_delay = retry_delay
        self._interval = progress_interval
        self._chunk = chunk_size
        self._clock = clock
        self._flights: dict[str, _Flight] = {}
        self._locks = CacheLocks()
        self.inventory = Inventory(self.cache_dir, self._locks)

    def in_flight(self) -> frozenset[str]:
        """Cache names being fetched now."""
        return frozenset(self._flights)

    async def list_cache(self) -> list[CachedSource]:
        return await self.inventory.list_cache()

    async def collect(self, unwanted: list[str]) -> CollectResult:
        return await self.inventory.collect(unwanted)

    async def close(self) -> None:
        """Stop every fetch; what was written stays for the next fetch to resume."""
        tasks = [f.task for f in self._flights.values() if f.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._mirrors.values():
            await client.close()

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
        """The local path of ``source``, fetching it first when the cache lacks it: the
        GGUF file (the first part of a split one), the single file of a URL, the
        directory of a whole repository, or a local source where it is. ``vouched``: the
        sha256 the control plane sent for the source's files (its mirror's), believed
        over what the hub lists; ``hub``: the mirror it named to fetch them from."""
        src = parse_source(source, allow_http=self.hub.allow_http)
        check_named_pickle(src, allow_pickle=allow_pickle)
        if src.kind == "local":
            return await asyncio.to_thread(_check_local, src, allow_pickle)
        name = cache_name(src)
        waiter = _Waiter(replica_id=replica_id, allow_pickle=allow_pickle, progress=progress)
        flight = self._flights.get(name)
        if flight is None:
            flight = _Flight(
                name=name,
                source=src,
                given=source.strip(),
                waiters=[waiter],
                vouched=dict(vouched or {}),
                hub=hub,
            )
            self._flights[name] = flight
            flight.task = asyncio.create_task(self._run(flight), name=f"weights {name}")
            flight.task.add_done_callback(functools.partial(self._landed, flight))
        else:
            flight.waiters.append(waiter)
        assert flight.task is not None
        try:
            # Shielded: one caller giving up must not stop the download the others wait on.
            manifest = await asyncio.shield(flight.task)
        finally:
            flight.waiters.remove(waiter)
        # Looked at again for each caller, and for a source already in the cache: it may
        # have been fetched for a model that allowed pickles.
        pickled = [f.path for f in manifest.files if is_pickled(f.path)]
        if pickled and not allow_pickle:
            raise pickle_refusal(src.text, pickled)
        directory = self.cache_dir / name
        return directory / manifest.entry if manifest.entry else directory

    def _landed(self, flight: _Flight, task: asyncio.Task[Manifest]) -> None:
        if self._flights.get(flight.name) is flight:
            del self._flights[flight.name]
        if not task.cancelled():
            task.exception()  # retrieved: the callers have it, the loop need not log it

    async def _run(self, flight: _Flight) -> Manifest:
        await self._locks.hold(flight.name)
        reporter: _Reporter | None = None
        try:
            directory = self.cache_dir / flight.name
            cached = await asyncio.to_thread(load_complete, directory, flight.name)
            if cached is not None:
                _check_vouched(flight, cached)
                return cached
            items, entry = await self._plan(flight.source, flight.vouched, self._hub(flight.hub))
            pickled = [i.path for i in items if is_pickled(i.path)]
            if pickled and not any(w.allow_pickle for w in flight.waiters):
                raise pickle_refusal(flight.source.text, pickled)
            have = await asyncio.to_thread(_bytes_held, directory, items)
            await self._check_disk(flight.source, sum(_missing(i, have) for i in items))
            await asyncio.to_thread(prepare_directory, directory, flight.source.text)
            sizes = [i.size for i in items]
            total = None if None in sizes else sum(s for s in sizes if s is not None)
            reporter = _Reporter(flight, total, self._interval, self._clock, held=have)
            reporter.tick(force=True)
            records = [await self._fetch_file(flight, directory, i, reporter) for i in items]
            manifest = Manifest(
                source=flight.source.text, name=flight.name, entry=entry, files=records
            )
            await asyncio.to_thread(write_manifest, directory, manifest)
            reporter.finish()
            return manifest
        except Exception as exc:
            if reporter is not None:
                reporter.fail(str(exc))
            raise
        finally:
            self._locks.release(flight.name)

    def _hub(self, endpoint: str | None) -> HubClient:
        """Our hub, or a mirror's: no token goes to a mirror (``environ={}``)."""
        if endpoint is None:
            return self.hub
        client = self._mirrors.get(endpoint)
        if client is None:
            client = HubClient(endpoint, environ={}, allow_http=self.hub.allow_http)
            self._mirrors[endpoint] = client
        return client

    async def _plan(
        self, src: Source, vouched: Mapping[str, str], hub: HubClient
    ) -> tuple[list[_Item], str]:
        if src.kind == "url":
            assert src.url is not None and src.filename is not None
            return [_Item(path=src.filename, url=src.url, size=None, sha256=None)], src.filename
        assert src.repo is not None
        listing = await hub.list_files(src.repo, self._revision)
        selection = select_files(src, listing)
        items = [
            _Item(
                path=f.path,
                url=hub.resolve_url(src.repo, f.path, self._revision),
                size=f.size,
                sha256=vouched.get(f.path) or f.sha256,
                repo=src.repo,
            )
            for f in selection.files
        ]
        return items, selection.entry

    async def _check_disk(self, src: Source, needed: int) -> None:
        if needed <= 0:
            return
        await asyncio.to_thread(self.cache_dir.mkdir, parents=True, exist_ok=True)
        free = (await asyncio.to_thread(self._disk_usage, self.cache_dir)).free
        if needed > free:
            raise DiskSpaceError(
                f"{src.text}: not enough disk in {self.cache_dir}: {format_bytes(needed)} "
                f"still to fetch, {format_bytes(free)} free"
            )

    async def _fetch_file(
        self, flight: _Flight, directory: Path, item: _Item, reporter: _Reporter
    ) -> FileRecord:
        final = directory / item.path
        reporter.file = item.path
        if item.size is not None and await asyncio.to_thread(is_whole, final, item.size):
            # Only verified files ever take their final name.
            reporter.held[item.path] = item.size
            return FileRecord(item.path, item.size, item.sha256, verified=bool(item.sha256))
        attempt = 0
        while True:
            try:
                record = await self._download(flight, item, final, reporter)
            except NetworkError as exc:
                if attempt >= self._retries:
                    raise
                attempt += 1
                delay = self._retry_delay * 2 ** (attempt - 1)
                log.warning("%s: %s; resuming in %.0f s", flight.source.text, exc, delay)
                await asyncio.sleep(delay)
                continue
            reporter.held[item.path] = record.size
            return record

    async def _download(
        self, flight: _Flight, item: _Item, final: Path, reporter: _Reporter
    ) -> FileRecord:
        part = final.with_name(final.name + PART_SUFFIX)
        hasher = hashlib.sha256()
        have = await asyncio.to_thread(resume_point, part, item.size, hasher)
        reporter.held[item.path] = have
        if item.size is not None and have == item.size and have > 0:
            return await self._finish(item, part, final, have, hasher)
        async with self.hub.download(item.url, offset=have, repo=item.repo, path=item.path) as body:
            if body.status == 416:
                if have and have in (body.total, item.size):
                    return await self._finish(item, part, final, have, hasher)
                await asyncio.to_thread(part.unlink, missing_ok=True)
                raise NetworkError(f"{item.path}: the server refused to resume at byte {have}")
            if body.status == 206 and body.offset != have:
                raise NetworkError(
                    f"{item.path}: asked for bytes from {have}, the server sent from {body.offset}"
                )
            if body.status == 200 and have:
                log.info("%s: the server ignored Range and sent the whole file", item.path)
                have, hasher = 0, hashlib.sha256()
                reporter.held[item.path] = 0
            if item.size is not None and body.total is not None and body.total != item.size:
                raise HubError(
                    f"{item.path}: the server says {body.total} bytes, the listing {item.size}"
                )
            size = item.size
            if size is None:
                # A URL source is its one file, so its length is the source's total.
                size = reporter.total = body.total
                await self._check_disk(flight.source, (size or 0) - have)
            fh = await asyncio.to_thread(open_part, part, have)
            try:
                have = await self._copy(body.read, fh, hasher, have, size, item, reporter)
            except ChecksumError:
                await asyncio.to_thread(drop_part, fh, part)
                raise
            finally:
                if not fh.closed:
                    await asyncio.to_thread(fh.close)
        if item.size is not None and have < item.size:
            raise NetworkError(f"{item.path}: the server ended the file at byte {have}")
        return await self._finish(item, part, final, have, hasher)

    async def _copy(
        self,
        read: Callable[[int], Awaitable[bytes]],
        fh: IO[bytes],
        hasher: hashlib._Hash,
        have: int,
        size: int | None,
        item: _Item,
        reporter: _Reporter,
    ) -> int:
        """Body to part file, written and hashed in batches off the loop; returns bytes
        held. Bytes received before a cut are written, for the next try to resume."""
        buffer = bytearray()
        try:
            while True:
                chunk = await read(self._chunk)
                if not chunk:
                    break
                if size is not None and have + len(buffer) + len(chunk) > size:
                    raise ChecksumError(
                        f"{item.path}: the server sent more than the {size} bytes it announced"
                    )
                buffer += chunk
                if len(buffer) >= self._chunk:
                    await asyncio.to_thread(append_block, fh, hasher, bytes(buffer))
                    have += len(buffer)
                    buffer.clear()
                    reporter.held[item.path] = have
                    reporter.tick()
        except NetworkError:
            if buffer:
                await asyncio.to_thread(append_block, fh, hasher, bytes(buffer))
                reporter.held[item.path] = have + len(buffer)
            raise
        if buffer:
            await asyncio.to_thread(append_block, fh, hasher, bytes(buffer))
            have += len(buffer)
            reporter.held[item.path] = have
        return have

    async def _finish(
        self, item: _Item, part: Path, final: Path, size: int, hasher: hashlib._Hash
    ) -> FileRecord:
        got = hasher.hexdigest()
        if item.sha256 is not None and got != item.sha256:
            await asyncio.to_thread(part.unlink, missing_ok=True)
            raise ChecksumError(
                f"{item.path}: sha256 mismatch: expected {item.sha256}, got {got}; the "
                "partial file was deleted and the next fetch starts over"
            )
        await asyncio.to_thread(publish, part, final)
        return FileRecord(item.path, size, got, verified=item.sha256 is not None)


def _check_vouched(flight: _Flight, cached: Manifest) -> None:
    """A source already held must be what the control plane vouches for."""
    for record in cached.files:
        want = flight.vouched.get(record.path)
        if want and record.sha256 != want:
            raise ChecksumError(
                f"{flight.source.text}: the cached {record.path} has sha256 {record.sha256}, "
                f"the control plane vouches for {want}; remove it (`llmgw ctl model rm "
                "--files`) to fetch it again"
            )


def _check_local(src: Source, allow_pickle: bool) -> Path:
    assert src.path is not None
    path = src.path
    if not path.exists():
        raise SourceError(f"{src.text}: no such file or directory on this node")
    if path.is_file():
        if not allow_pickle and is_pickled(path.resolve().name):
            raise pickle_refusal(src.text, [str(path.resolve())])
        return path
    names: list[str] = []
    for root, _dirs, files in os.walk(path):
        names.extend(os.path.relpath(os.path.join(root, f), path) for f in files)
    if not allow_pickle and not any(n.endswith((".safetensors", ".gguf")) for n in names):
        pickled = sorted(n for n in names if is_pickled(n))
        if pickled:
            raise pickle_refusal(src.text, pickled)
    return path


def _bytes_held(directory: Path, items: list[_Item]) -> dict[str, int]:
    held: dict[str, int] = {}
    for item in items:
        final = directory / item.path
        part = final.with_name(final.name + PART_SUFFIX)
        if item.size is not None and is_whole(final, item.size):
            held[item.path] = item.size
        else:
            try:
                size = part.stat().st_size
            except OSError:
                size = 0
            # A part longer than the file is no prefix of it; it will be dropped.
            held[item.path] = 0 if item.size is not None and size > item.size else size
    return held


def _missing(item: _Item, held: dict[str, int]) -> int:
    if item.size is None:
        return 0
    return max(item.size - min(held.get(item.path, 0), item.size), 0)
