"""A mirror on a node (``llmgw mirror serve``): a directory laid out as the control
plane's mirror, served read-only at ``/mirror/``, and kept in step with another mirror
(``--follow URL``, the control plane's or ``mirror.api``'s) every 15 s.

Following reads the other mirror's ``/mirror/index.json``, fetches each file this one
lacks (or holds with another sha256) into a hidden file beside its place, checks its
size and sha256 against that index, and renames it in; the index is written last, so
a file is served only once it is whole and checked. A file that does not check out is
dropped and named in the log; the rest are kept, and the next round tries again. The
agents check every file they fetch against the sha256 the control plane sends them, so
a mirror that followed a changed source serves nothing they take.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
from aiohttp import web

from llmgw.config import parse_hostport
from llmgw.offline.manifest import (
    INDEX,
    BundleError,
    BundleFile,
    Manifest,
    dump_manifest,
    parse_manifest,
)
from llmgw.offline.mirrorfiles import PREFIX, MirrorFiles, url_path

log = logging.getLogger("llmgw.mirror")

FOLLOW_EVERY = 15.0
CHUNK = 1 << 20


@dataclass
class FollowRound:
    """What one round of following did."""

    fetched: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # path -> why


def _held(root: Path, f: BundleFile, index: Manifest | None) -> bool:
    mine = next((g for g in (index.files if index else []) if g.path == f.path), None)
    path = root / f.path
    return (
        mine is not None
        and mine.sha256 == f.sha256
        and path.is_file()
        and path.stat().st_size == f.size
    )


async def follow_once(root: Path, source: str, http: aiohttp.ClientSession) -> FollowRound:
    """Bring ``root`` in step with the mirror at ``source`` (``http://HOST:PORT``)."""
    base = source.rstrip("/") + PREFIX
    async with http.get(base + INDEX) as resp:
        if resp.status != 200:
            raise BundleError(f"{base}{INDEX} answered HTTP {resp.status}")
        theirs = parse_manifest(await resp.read(), base + INDEX)
    mine = MirrorFiles(root).index()
    done = FollowRound()
    kept: list[BundleFile] = []
    for f in theirs.files:
        if _held(root, f, mine):
            kept.append(f)
            continue
        why = await _fetch(root, base + url_path(f), f, http)
        if why is None:
            kept.append(f)
            done.fetched.append(f.path)
        else:
            done.refused[f.path] = why
            log.warning("mirror: %s from %s refused: %s", f.path, source, why)
    root.mkdir(parents=True, exist_ok=True)
    part = root / f".{INDEX}.part"
    part.write_bytes(dump_manifest(replace(theirs, files=kept)))
    os.replace(part, root / INDEX)
    return done


async def _fetch(root: Path, url: str, f: BundleFile, http: aiohttp.ClientSession) -> str | None:
    """None once ``f`` is in place and checked; else why not."""
    target = root / f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.part")
    sha = hashlib.sha256()
    size = 0
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                return f"{url} answered HTTP {resp.status}"
            with part.open("wb") as out:
                async for chunk in resp.content.iter_chunked(CHUNK):
                    size += len(chunk)
                    if size > f.size:
                        return f"{url} sent more than the {f.size} bytes its index lists"
                    sha.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
        if size != f.size or sha.hexdigest() != f.sha256:
            return f"{url}: {size} bytes, sha256 {sha.hexdigest()}; its index lists {f.sha256}"
        os.replace(part, target)
        return None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return f"{url}: {exc or 'timed out'}"
    finally:
        part.unlink(missing_ok=True)


async def serve(root: Path, listen: str, follow: str | None, stop: asyncio.Event) -> None:
    """Serve ``root`` at ``listen`` until ``stop``; follow ``follow`` every 15 s."""
    files = MirrorFiles(root)
    runner = web.ServerRunner(web.Server(files.handle), handle_signals=False)
    await runner.setup()
    host, port = parse_hostport(listen)
    await web.TCPSite(runner, host, port).start()
    log.info("mirror of %s on %s%s", root, listen, f", following {follow}" if follow else "")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    try:
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as http:
            while not stop.is_set():
                if follow:
                    try:
                        done = await follow_once(root, follow, http)
                        if done.fetched:
                            log.info("mirror: %d files from %s", len(done.fetched), follow)
                    except (BundleError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                        log.warning("mirror: %s does not answer: %s", follow, exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FOLLOW_EVERY):
                        await stop.wait()
    finally:
        await runner.cleanup()
