"""``llmgw bundle create``: one llmgw release, the pinned engine builds and named model
files gathered for a cluster with no internet, each checked as it comes.

- llmgw: this version's signed ``SHA256SUMS`` (the signature checked against the keys
  built into llmgw) and the zipapp of each platform named, each against those sums;
- llama.cpp: the pinned release's archive for each platform and build, checked against
  the pinned digest, else the one its release source publishes;
- models: the files each source selects (as an agent would select them), each against
  the hub's sha256 (its LFS files) or, for small files the hub lists without one, its
  size; the sha256 of what was fetched goes in the manifest either way.

The output is a directory, or a tar of one (``-o FILE.tar``): then the manifest's own
sha256 is printed, for carrying apart and giving to ``bundle import --manifest-sha256``.
A bundle is written beside its final place and renamed there only when whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from llmgw import release
from llmgw.agent.engines.install import (
    ASSETS,
    GITHUB_API,
    GITHUB_RELEASES,
    parse_sha256_file,
    release_arch,
    release_tag,
)
from llmgw.modelkit.hub import HubClient, HubError, select_files
from llmgw.modelkit.sources import SourceError, is_loopback_host, parse_source
from llmgw.offline.manifest import (
    MANIFEST,
    BundleError,
    BundleFile,
    Kind,
    Manifest,
    dump_manifest,
    engine_path,
    llmgw_path,
    model_path,
)
from llmgw.releasekey import PUBLIC_KEYS

CHUNK = 1 << 20
# llama.cpp's release source unless told (the one the agents use by default).
ENGINE_SOURCE = GITHUB_RELEASES


@dataclass(frozen=True)
class BundlePlan:
    """What ``bundle create`` gathers, and from where."""

    out: Path
    llmgw_version: str
    llmgw_source: str = release.DEFAULT_SOURCE
    platforms: list[str] = field(default_factory=lambda: [release.platform_tag()])
    # {engine: {version, sha256: {asset: hex}}}: the fleet's pins (enginepins.pinned()).
    engines: dict[str, dict[str, object]] = field(default_factory=dict)
    engine_source: str = ENGINE_SOURCE
    engine_builds: list[str] = field(default_factory=lambda: ["cpu"])
    models: list[str] = field(default_factory=list)
    hub_endpoint: str | None = None
    keys: tuple[str, ...] = PUBLIC_KEYS
    github_api: str = GITHUB_API


@dataclass(frozen=True)
class Made:
    path: Path
    manifest_sha256: str
    files: int
    size: int


def _say_nothing(words: str) -> None:
    pass


def machine_of(tag: str) -> str:
    """``x86_64`` of the platform tag ``py311-linux-x86_64``."""
    head, sep, machine = tag.partition("-linux-")
    if not sep or not head.startswith("py") or not machine:
        raise BundleError(f"{tag!r} is not a platform tag; give one like {release.platform_tag()}")
    return machine


async def create(plan: BundlePlan, say: Callable[[str], None] = _say_nothing) -> Made:
    """Gather ``plan`` into ``plan.out`` (a directory, or a ``.tar``)."""
    as_tar = plan.out.suffix == ".tar"
    if plan.out.exists() and (as_tar or any(plan.out.iterdir())):
        raise BundleError(f"{plan.out} already exists: name a new file or an empty directory")
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{plan.out.name}.", dir=plan.out.parent))
    try:
        files = await _gather(plan, stage, say)
        manifest = Manifest(
            format=1,
            created=time.time(),
            llmgw_version=plan.llmgw_version,
            files=files,
            models=list(plan.models),
        )
        data = dump_manifest(manifest)
        (stage / MANIFEST).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        if as_tar:
            part = plan.out.with_name(f".{plan.out.name}.part")
            await asyncio.to_thread(_write_tar, stage, part, files)
            os.replace(part, plan.out)
        else:
            with contextlib.suppress(FileNotFoundError):
                plan.out.rmdir()  # an empty directory named on purpose
            os.replace(stage, plan.out)
        return Made(plan.out, digest, len(files), sum(f.size for f in files))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _write_tar(stage: Path, part: Path, files: list[BundleFile]) -> None:
    try:
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(stage / MANIFEST, MANIFEST)
            for f in files:
                tar.add(stage / f.path, f.path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


async def _gather(plan: BundlePlan, stage: Path, say: Callable[[str], None]) -> list[BundleFile]:
    files = await asyncio.to_thread(_llmgw_release, plan, stage, say)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as http:
        for engine, want in plan.engines.items():
            files += await _engine(plan, engine, want, http, stage, say)
    if plan.models:
        endpoint = plan.hub_endpoint
        loopback = bool(endpoint) and is_loopback_host(urlsplit(str(endpoint)).hostname)
        async with HubClient(endpoint, allow_http=loopback) as hub:
            for source in plan.models:
                files += await _model(hub, source, stage, say)
    return files


# --- llmgw ------------------------------------------------------------------------------


def _llmgw_release(plan: BundlePlan, stage: Path, say: Callable[[str], None]) -> list[BundleFile]:
    version = str(release.Version.parse(plan.llmgw_version))
    source = plan.llmgw_source
    try:
        sig_url = release.release_url(source, version, release.SIGNATURE)
        sums_url = release.release_url(source, version, release.SUMS)
        signature = release.fetch_small(sig_url)
        sums = release.fetch_small(sums_url)
        release.verify_signature(sums, signature, plan.keys, where=sig_url)
        digests = release.parse_sums(sums, where=sums_url)
        folder = stage / llmgw_path(version, "x").rsplit("/", 1)[0]
        folder.mkdir(parents=True)
        (folder / release.SUMS).write_bytes(sums)
        (folder / release.SIGNATURE).write_bytes(signature)
        out = [
            _small(version, release.SUMS, "llmgw-sums", sums, sums_url),
            _small(version, release.SIGNATURE, "llmgw-signature", signature, sig_url),
        ]
        for tag in plan.platforms:
            machine_of(tag)
            name = release.asset_name(version, tag)
            say(f"llmgw {version}: fetching {name}")
            fetched = release.fetch(source, version, folder, tag=tag, keys=plan.keys)
            os.replace(fetched.path, folder / name)
            if digests.get(name) != fetched.sha256:
                raise BundleError(f"{name}: not the digest the signed sums name")
            out.append(
                BundleFile(
                    path=llmgw_path(version, name),
                    kind="llmgw",
                    sha256=fetched.sha256,
                    size=fetched.size,
                    origin=release.release_url(source, version, name),
                    version=version,
                )
            )
    except release.ReleaseError as exc:
        raise BundleError(f"llmgw {version} from {source}: {exc}") from None
    return out


def _small(version: str, name: str, kind: Kind, data: bytes, url: str) -> BundleFile:
    return BundleFile(
        path=llmgw_path(version, name),
        kind=kind,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        origin=url,
        version=version,
    )


# --- engines ----------------------------------------------------------------------------


async def _engine(
    plan: BundlePlan,
    engine: str,
    want: dict[str, object],
    http: aiohttp.ClientSession,
    stage: Path,
    say: Callable[[str], None],
) -> list[BundleFile]:
    if engine != "llama.cpp":
        raise BundleError(
            f"{engine}: only llama.cpp's release archives go in a bundle (vLLM and SGLang "
            "install from a package index: mirror that index and set the engine's index_url)"
        )
    tag = release_tag(str(want.get("version") or ""))
    pins = want.get("sha256")
    pinned = dict(pins) if isinstance(pins, dict) else {}
    source = plan.engine_source.rstrip("/")
    out: list[BundleFile] = []
    for platform in plan.platforms:
        arch = release_arch(machine_of(platform))
        for build in plan.engine_builds:
            pattern = ASSETS.get(build)
            if pattern is None:
                raise BundleError(f"llama.cpp has no {build!r} build (builds: {', '.join(ASSETS)})")
            asset = pattern.format(tag=tag, build=build, arch=arch, cuda="12.4")
            if any(f.path == engine_path(tag, asset) for f in out):
                continue  # two Python versions of one machine share the archive
            expected = str(pinned.get(asset) or "") or await _published(plan, http, tag, asset)
            url = f"{source}/download/{tag}/{asset}"
            say(f"llama.cpp {tag}: fetching {asset}")
            target = stage / engine_path(tag, asset)
            digest, size = await _download(http, url, target)
            if digest != expected:
                said = "pinned" if asset in pinned else "published"
                raise BundleError(
                    f"{url}: sha256 {digest} is not the {said} {expected}; a corrupt or "
                    "tampered download, nothing was bundled"
                )
            out.append(
                BundleFile(
                    path=engine_path(tag, asset),
                    kind="engine",
                    sha256=digest,
                    size=size,
                    origin=url,
                    version=tag,
                    engine=engine,
                )
            )
    return out


async def _published(plan: BundlePlan, http: aiohttp.ClientSession, tag: str, asset: str) -> str:
    """The digest the release source publishes for ``asset``: GitHub's API for a
    github.com source, the ``.sha256`` file beside it otherwise."""
    source = plan.engine_source.rstrip("/")
    if urlsplit(source).hostname == "github.com":
        owner, repo = urlsplit(source).path.strip("/").split("/")[:2]
        url = f"{plan.github_api.rstrip('/')}/repos/{owner}/{repo}/releases/tags/{tag}"
        async with http.get(url, headers={"Accept": "application/vnd.github+json"}) as resp:
            if resp.status != 200:
                raise BundleError(f"{url} answered HTTP {resp.status}: no digest for {asset}")
            answer = await resp.json(content_type=None)
        for item in answer.get("assets", []) if isinstance(answer, dict) else []:
            digest = str(item.get("digest") or "") if isinstance(item, dict) else ""
            if isinstance(item, dict) and item.get("name") == asset and len(digest) == 71:
                return digest.removeprefix("sha256:").lower()
        raise BundleError(f"GitHub publishes no sha256 for {asset} in {tag}; pin one")
    url = f"{source}/download/{tag}/{asset}.sha256"
    async with http.get(url) as resp:
        if resp.status != 200:
            raise BundleError(
                f"no sha256 is published for {asset} ({url} answered HTTP {resp.status}) "
                "and none is pinned: llmgw bundles nothing it cannot check"
            )
        text = (await resp.read()).decode(errors="replace")
    try:
        return parse_sha256_file(text, asset)
    except ValueError as exc:
        raise BundleError(str(exc)) from None


async def _download(http: aiohttp.ClientSession, url: str, target: Path) -> tuple[str, int]:
    target.parent.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256()
    size = 0
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                raise BundleError(f"{url} answered HTTP {resp.status}")
            with target.open("wb") as out:
                async for chunk in resp.content.iter_chunked(CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(out.write, chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BundleError(f"{url}: the download failed ({exc or 'timed out'})") from None
    return sha.hexdigest(), size


# --- models -----------------------------------------------------------------------------


async def _model(
    hub: HubClient, text: str, stage: Path, say: Callable[[str], None]
) -> list[BundleFile]:
    try:
        source = parse_source(text)
        if source.kind != "hf" or source.repo is None:
            raise BundleError(
                f"{text}: only hf: sources go in a bundle (copy a URL's or a local file to "
                "the nodes yourself)"
            )
        selection = select_files(source, await hub.list_files(source.repo))
    except (SourceError, HubError) as exc:
        raise BundleError(f"{text}: {exc}") from None
    out: list[BundleFile] = []
    for f in selection.files:
        url = hub.resolve_url(source.repo, f.path)
        say(f"{source.text}: fetching {f.path}")
        target = stage / model_path(source.repo, f.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = await _hub_file(hub, url, target, source.repo, f.path)
        if f.sha256 is not None and digest != f.sha256:
            raise BundleError(
                f"{source.text} {f.path}: sha256 {digest} is not the hub's {f.sha256}; "
                "a corrupt download, nothing was bundled"
            )
        if f.size is not None and size != f.size:
            raise BundleError(
                f"{source.text} {f.path}: {size} bytes, the hub lists {f.size}; nothing was bundled"
            )
        out.append(
            BundleFile(
                path=model_path(source.repo, f.path),
                kind="model",
                sha256=digest,
                size=size,
                origin=url,
                repo=source.repo,
                repo_path=f.path,
                hub_sha256=f.sha256 is not None,
            )
        )
    return out


async def _hub_file(
    hub: HubClient, url: str, target: Path, repo: str, path: str
) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    try:
        async with hub.download(url, repo=repo, path=path) as body:
            if body.status != 200:
                raise BundleError(f"hf:{repo} {path}: the hub answered {body.status}")
            with target.open("wb") as out:
                while chunk := await body.read(CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(out.write, chunk)
    except HubError as exc:
        raise BundleError(f"hf:{repo} {path}: {exc}") from None
    return sha.hexdigest(), size
