"""llama.cpp installed by the node itself from a release archive, and the installs
already there, checked again.

The node works out its build (``cuda`` when an NVIDIA driver is loaded, ``cpu``
otherwise), fetches the release archive from the release source, checks it against
the sha256 published for it, unpacks it refusing anything that would leave its
directory, names any library ``ldd`` cannot find, runs ``llama-server --version``, and
only then writes ``installed.json`` into the version's directory. A directory without
that marker is not installed.

Layout: ``{install_root}/llama.cpp/{tag}-{build}/`` holds the unpacked archive and the
marker; downloads and half-unpacked trees are dot-named beside it and never read.

Release source: GitHub's layout, ``{source}/download/{tag}/{asset}``, and
``{source}/latest`` redirecting to ``.../tag/{tag}``. Asset names follow llama.cpp's
releases: ``llama-b1234-bin-ubuntu-x64.tar.gz`` for the CPU (``.zip`` before late
2025; a pattern ending ``.zip`` works too). As of this writing llama.cpp's GitHub
releases carry no Linux CUDA archive (Windows has ``llama-b1234-bin-win-cuda-12.4-x64.zip``),
so the CUDA pattern follows that naming for a mirror that builds one; both are settings.

Checksums: ``checksum="file"`` reads ``{asset}.sha256`` beside the asset (the hex
digest, optionally followed by the file name, as ``sha256sum`` writes it): what a
mirror publishes, and what the tests serve. ``checksum="github"`` reads the ``digest``
GitHub's API gives each release asset (``sha256:...``, on releases since June 2025),
since llama.cpp's releases ship no checksum files. ``auto`` picks ``github`` for a
source on github.com and ``file`` otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlsplit

import aiohttp

from llmgw.agent.engines.archive import ArchiveError, unpack
from llmgw.agent.engines.llamacpp import LlamaCppAdapter
from llmgw.agent.engines.verify import EngineCheckError, Ldd, check_libraries, run_ldd, seen_to_run
from llmgw.wire.messages import EngineInfo

ENGINE = "llama.cpp"
BINARY = "llama-server"
MARKER = "installed.json"


class InstallMarker(TypedDict):
    """``installed.json``, written last into an install: what it is and where from."""

    engine: str
    version: str  # the release tag, b6000
    build: str
    path: str
    binary: str  # the binary's path inside the install
    sha256: str
    asset: str
    source: str
    reported_version: str | None  # what the binary said of itself
    installed_at: float


GITHUB_RELEASES = "https://github.com/ggml-org/llama.cpp/releases"
GITHUB_API = "https://api.github.com"
DRIVER_VERSION = Path("/proc/driver/nvidia/version")
ASSETS: Mapping[str, str] = {
    "cpu": "llama-{tag}-bin-ubuntu-{arch}.tar.gz",
    "cuda": "llama-{tag}-bin-ubuntu-cuda-{cuda}-{arch}.tar.gz",
}
_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}\Z")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# Unpacked trees take up to about twice the archive; keep room for that and the archive.
DISK_FACTOR = 3
REPORT_EVERY = 2.0


class InstallError(RuntimeError):
    """An install that did not happen; the message is the node's own words for why."""


def detect_build(driver_version: Path = DRIVER_VERSION) -> str:
    """``cuda`` when an NVIDIA kernel driver is loaded, ``cpu`` otherwise."""
    return "cuda" if driver_version.exists() else "cpu"


def release_arch(machine: str | None = None) -> str:
    machine = (machine or platform.machine()).lower()
    return _ARCH.get(machine, machine)


def release_tag(version: str) -> str:
    """``1234`` or ``b1234`` as llama.cpp's tag, ``b1234``."""
    tag = f"b{version}" if version.isdigit() else version
    if not _TAG.match(tag):
        raise InstallError(f"{version!r} is not a llama.cpp release tag (like b1234)")
    return tag


def human_size(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} B"


def _tag_order(name: str) -> tuple[int, str]:
    m = re.match(r"b(\d+)-", name)
    return (int(m[1]) if m else -1, name)


def parse_sha256_file(text: str, asset: str) -> str:
    """The digest in a ``.sha256`` file: ``HEX`` or ``HEX  NAME`` (``*NAME`` in binary
    mode); a file naming another asset is refused rather than believed."""
    fields = text.split()
    if not fields or not _HEX64.match(fields[0]):
        raise InstallError(f"{asset}.sha256 holds no sha256 digest")
    if len(fields) > 1 and os.path.basename(fields[1].lstrip("*")) != asset:
        raise InstallError(f"{asset}.sha256 is the checksum of {fields[1]!r}")
    return fields[0].lower()


def _quiet(words: str) -> None:
    pass


class LlamaCppInstaller:
    """Installs one llama.cpp release for this node's build, and lists the installs."""

    def __init__(
        self,
        install_root: Path,
        release_source: str = GITHUB_RELEASES,
        version: str | None = None,
        progress: Callable[[str], None] = _quiet,
        *,
        detect: Callable[[], str] = detect_build,
        arch: str | None = None,
        cuda: str = "12.4",
        assets: Mapping[str, str] = ASSETS,
        checksum: str = "auto",
        github_api: str = GITHUB_API,
        ldd: Ldd = run_ldd,
    ) -> None:
        self.root = install_root / ENGINE
        self.source = release_source.rstrip("/")
        self.version = release_tag(version) if version else None
        self.progress = progress
        self.detect = detect
        self.arch = release_arch(arch)
        self.cuda = cuda
        self.assets = dict(assets)
        if checksum == "auto":
            checksum = "github" if urlsplit(self.source).hostname == "github.com" else "file"
        if checksum not in ("file", "github"):
            raise ValueError(f"checksum must be auto, file or github, not {checksum!r}")
        self.checksum = checksum
        self.github_api = github_api.rstrip("/")
        self.ldd = ldd
        self.adapter = LlamaCppAdapter()
        # What each install directory's last check found wrong, for the node to show.
        self.problems: dict[str, str] = {}
        self._lock = asyncio.Lock()

    def asset(self, tag: str, build: str) -> str:
        pattern = self.assets.get(build)
        if pattern is None:
            raise InstallError(f"no llama.cpp release archive is known for the {build} build")
        return pattern.format(tag=tag, build=build, arch=self.arch, cuda=self.cuda)

    def directory(self, tag: str, build: str) -> Path:
        return self.root / f"{tag}-{build}"

    # --- what is installed ------------------------------------------------------------

    async def installed(self) -> list[EngineInfo]:
        """Every marked install that still runs, newest first. One that no longer runs
        (a library removed since) is left out, its reason in ``problems``."""
        found: list[EngineInfo] = []
        for directory in marked(self.root, _tag_order):
            info = await self._recheck(directory)
            if info is not None:
                found.append(info)
        return found

    async def _recheck(self, directory: Path) -> EngineInfo | None:
        try:
            marker: InstallMarker = json.loads((directory / MARKER).read_text())
            binary = (directory / marker["binary"]).resolve()
            if not binary.is_relative_to(directory.resolve()):
                raise InstallError(f"its marker names {binary}, outside {directory}")
            await check_libraries(binary, self.ldd)
            await seen_to_run(self.adapter, str(binary))
            info = EngineInfo(
                name=ENGINE,
                path=str(binary),
                version=str(marker["version"]),
                build=str(marker["build"]),
                origin="installed",
            )
        except (OSError, ValueError, KeyError, TypeError, InstallError, EngineCheckError) as e:
            reason = f"llama.cpp in {directory.name} no longer runs: {e}"
            if self.problems.get(directory.name) != reason:
                self.progress(reason)
            self.problems[directory.name] = reason
            return None
        self.problems.pop(directory.name, None)
        return info

    async def ensure(
        self,
        progress: Callable[[str], None] | None = None,
        *,
        version: str | None = None,
        build: str | None = None,
        pins: Mapping[str, str] | None = None,
    ) -> EngineInfo:
        """A release for this node's build: the install already there when it still
        runs, otherwise installed now. ``version`` (the fleet's) wins over the configured
        one; with neither, any install of this build that runs will do, and only a node
        with none asks the release source for its latest. ``pins`` maps release archive
        names to the sha256 they must have (over what the source publishes)."""
        tag = release_tag(version) if version else self.version
        async with self._lock:  # eight shards asking at once make one install
            build = build or self.detect()
            for info in await self.installed():
                if info.build == build and tag in (None, info.version):
                    return info
            return await self._install(build, progress or self.progress, tag, pins or {})

    async def install(self, progress: Callable[[str], None] | None = None) -> EngineInfo:
        """Install the configured release for this node's build, replacing any there."""
        async with self._lock:
            return await self._install(self.detect(), progress or self.progress, self.version, {})

    async def remove(self, version: str, build: str) -> bool:
        """Delete one install (the fleet no longer names it); True when there was one."""
        directory = self.directory(release_tag(version), build)
        async with self._lock:
            if not directory.exists():
                return False
            (directory / MARKER).unlink(missing_ok=True)  # not installed from here on
            await asyncio.to_thread(shutil.rmtree, directory, True)
            self.problems.pop(directory.name, None)
            return True

    # --- installing -------------------------------------------------------------------

    async def _install(
        self,
        build: str,
        report: Callable[[str], None],
        tag: str | None,
        pins: Mapping[str, str],
    ) -> EngineInfo:
        try:
            return await self._install_steps(build, report, tag, pins)
        except (InstallError, EngineCheckError, ArchiveError) as exc:
            reason = str(exc)
        except aiohttp.ClientError as exc:
            reason = f"the release source did not answer: {exc}"
        except TimeoutError:
            reason = "the release source stopped answering (timed out)"
        except OSError as exc:
            reason = f"{exc.strerror or exc}: {exc.filename or self.root}"
        report(f"install failed: {reason}")
        raise InstallError(reason)

    async def _install_steps(
        self,
        build: str,
        report: Callable[[str], None],
        tag: str | None,
        pins: Mapping[str, str],
    ) -> EngineInfo:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
        # The digest is of the bytes as published; never let the client undo an encoding.
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as http:
            tag = tag or await self._latest(http)
            asset = self.asset(tag, build)
            url = f"{self.source}/download/{tag}/{asset}"
            # A digest the fleet pinned is believed over the one published beside it.
            pinned = pins.get(asset)
            expected = pinned or await self._published_sha256(http, tag, asset)
            self.root.mkdir(parents=True, exist_ok=True)
            part = self.root / f".{asset}.part"
            try:
                digest = await self._download(http, url, part, asset, report)
                report("installing: checking sha256")
                if digest != expected:
                    said = "pinned" if pinned else "published"
                    raise InstallError(
                        f"{asset} failed its sha256 check: {said} {expected}, downloaded {digest}"
                    )
                directory = self.directory(tag, build)
                report("installing: unpacking")
                await asyncio.to_thread(self._unpack, part, directory)
            finally:
                part.unlink(missing_ok=True)
        binary = await asyncio.to_thread(_find_binary, directory)
        report("installing: checking libraries")
        await check_libraries(binary, self.ldd)
        report(f"installing: running {BINARY} --version")
        reported, output = await seen_to_run(self.adapter, str(binary))
        marker: InstallMarker = {
            "engine": ENGINE,
            "version": tag,
            "build": build,
            "path": str(binary),
            "binary": str(binary.relative_to(directory)),
            "sha256": digest,
            "asset": asset,
            "source": url,
            # What the binary said of itself: a build from source says b0 or nothing.
            "reported_version": reported,
            "installed_at": time.time(),
        }
        await asyncio.to_thread(_write_marker, directory, marker)
        self.problems.pop(directory.name, None)
        report(f"installed llama.cpp {tag} ({build})")
        return EngineInfo(name=ENGINE, path=str(binary), version=tag, build=build)

    async def _latest(self, http: aiohttp.ClientSession) -> str:
        async with http.get(f"{self.source}/latest") as resp:
            if resp.status != 200:
                raise InstallError(f"{self.source}/latest answered HTTP {resp.status}")
            parts = resp.url.path.rstrip("/").split("/")
        if len(parts) < 2 or parts[-2] != "tag" or not _TAG.match(parts[-1]):
            raise InstallError(f"{self.source}/latest did not lead to a release tag")
        return parts[-1]

    async def _published_sha256(self, http: aiohttp.ClientSession, tag: str, asset: str) -> str:
        if self.checksum == "file":
            url = f"{self.source}/download/{tag}/{asset}.sha256"
            async with http.get(url) as resp:
                if resp.status != 200:
                    raise InstallError(
                        f"no sha256 is published for {asset} ({url} answered HTTP "
                        f"{resp.status}); llmgw installs nothing it cannot check"
                    )
                return parse_sha256_file((await resp.read()).decode(errors="replace"), asset)
        parts = urlsplit(self.source).path.strip("/").split("/")
        url = f"{self.github_api}/repos/{parts[0]}/{parts[1]}/releases/tags/{tag}"
        headers = {"Accept": "application/vnd.github+json"}
        async with http.get(url, headers=headers) as resp:
            if resp.status != 200:
                raise InstallError(f"GitHub's API answered HTTP {resp.status} for {tag}")
            release = json.loads(await resp.read())
        items = release.get("assets", []) if isinstance(release, dict) else []
        for item in items:
            if isinstance(item, dict) and item.get("name") == asset:
                digest = str(item.get("digest") or "")
                if digest.startswith("sha256:") and _HEX64.match(digest[7:]):
                    return digest[7:].lower()
                raise InstallError(
                    f"GitHub publishes no sha256 for {asset}; pick a newer release or a "
                    "mirror that publishes .sha256 files"
                )
        raise InstallError(f"release {tag} has no asset named {asset}")

    async def _download(
        self,
        http: aiohttp.ClientSession,
        url: str,
        part: Path,
        asset: str,
        report: Callable[[str], None],
    ) -> str:
        """Stream ``url`` into ``part``; the sha256 of what was written."""
        sha = hashlib.sha256()
        async with http.get(url) as resp:
            if resp.status != 200:
                raise InstallError(f"downloading {asset}: {url} answered HTTP {resp.status}")
            total = resp.content_length
            if total is not None:
                free = (await asyncio.to_thread(shutil.disk_usage, self.root)).free
                if free < total * DISK_FACTOR:
                    raise InstallError(
                        f"not enough disk in {self.root}: {human_size(free)} free, about "
                        f"{human_size(total * DISK_FACTOR)} needed for {asset}"
                    )
            size = f" ({human_size(total)})" if total is not None else ""
            report(f"installing: downloading {asset}{size}")
            loop = asyncio.get_running_loop()
            last = loop.time()
            done = 0
            out = await asyncio.to_thread(part.open, "wb")
            try:
                async for chunk in resp.content.iter_chunked(1 << 20):
                    sha.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
                    done += len(chunk)
                    if loop.time() - last >= REPORT_EVERY:
                        last = loop.time()
                        # A share only of a length the server sent; none is invented.
                        of = f" of {human_size(total)}" if total else " so far"
                        report(f"installing: downloading {asset}: {human_size(done)}{of}")
            finally:
                await asyncio.to_thread(out.close)
            if total is not None and done != total:
                raise InstallError(f"downloading {asset}: got {done} of {total} bytes")
        return sha.hexdigest()

    def _unpack(self, archive: Path, directory: Path) -> None:
        """Unpack beside the version's directory, then move it in: a half-unpacked tree
        never sits where an install is looked for."""
        staging = directory.with_name(f".{directory.name}.unpacking")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            unpack(archive, staging)
            if directory.exists():
                (directory / MARKER).unlink(missing_ok=True)  # not installed from here on
                shutil.rmtree(directory)
            staging.rename(directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def marked(root: Path, order: Callable[[str], tuple[object, ...]]) -> list[Path]:
    """The install directories under ``root`` that hold their marker, newest first by
    ``order`` of their names; staging trees (dot-named) and unmarked ones are never read."""
    if not root.is_dir():
        return []
    dirs = sorted(root.iterdir(), key=lambda p: order(p.name), reverse=True)
    return [d for d in dirs if not d.name.startswith(".") and (d / MARKER).is_file()]


def _find_binary(directory: Path) -> Path:
    """The ``llama-server`` in an unpacked release (``build/bin/``, ``llama-b1234/``, or
    the top: layouts have changed), the shallowest if several."""
    found = [p for p in directory.rglob(BINARY) if p.is_file()]
    if not found:
        raise InstallError(f"the archive holds no {BINARY}")
    binary = min(found, key=lambda p: (len(p.parts), str(p)))
    if not os.access(binary, os.X_OK):
        raise InstallError(f"{binary.relative_to(directory)} in the archive is not executable")
    return binary


def _write_marker(directory: Path, marker: Mapping[str, object]) -> None:
    tmp = directory / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.rename(directory / MARKER)
