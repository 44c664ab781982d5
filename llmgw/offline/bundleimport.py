"""``llmgw bundle import``: a bundle checked whole, then copied into the control
plane's mirror.

Everything is checked before anything is used, in this order: the tar (when it is one)
holds only plain files and directories under its root; the manifest reads, and its
sha256 is the one carried apart when given; the bundle holds exactly the files the
manifest lists, each of its size and sha256; each llmgw release's ``SHA256SUMS`` is
signed by a key this llmgw trusts and names each zipapp's sha256; each engine archive
pinned by this llmgw (or by the server's ``engines:``) has its pinned digest. A model
file's sha256 in the manifest is the hub's, read when the bundle was made.

Only then are the files copied into the mirror, each by rename from a hidden file
beside its place, and the mirror's ``index.json`` written last. A refusal names the
file and leaves the mirror as it was.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw import release
from llmgw.offline.manifest import (
    INDEX,
    MANIFEST,
    BundleError,
    BundleFile,
    Manifest,
    check_path,
    dump_manifest,
    parse_manifest,
)
from llmgw.releasekey import PUBLIC_KEYS

# A bundle of several models is large; a tar member past this is not one of ours.
MAX_MEMBER = 1 << 40


@dataclass(frozen=True)
class Imported:
    mirror: Path
    files: int
    size: int
    llmgw_version: str


def import_bundle(
    bundle: Path,
    mirror: Path,
    *,
    pins: Mapping[str, Mapping[str, object]] | None = None,
    keys: tuple[str, ...] = PUBLIC_KEYS,
    manifest_sha256: str | None = None,
) -> Imported:
    """Check ``bundle`` (a directory or a tar) whole, then fill ``mirror`` from it."""
    if not bundle.exists():
        raise BundleError(f"{bundle}: no such file or directory")
    mirror.parent.mkdir(parents=True, exist_ok=True)
    unpacked: Path | None = None
    try:
        if bundle.is_dir():
            root = bundle
        else:
            unpacked = Path(tempfile.mkdtemp(prefix=".bundle-import.", dir=mirror.parent))
            unpack_tar(bundle, unpacked)
            root = unpacked
        manifest = check_bundle(root, pins=pins, keys=keys, manifest_sha256=manifest_sha256)
        _fill(root, mirror, manifest)
    finally:
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
    return Imported(
        mirror=mirror,
        files=len(manifest.files),
        size=sum(f.size for f in manifest.files),
        llmgw_version=manifest.llmgw_version,
    )


def unpack_tar(archive: Path, into: Path) -> None:
    """Unpack a bundle's tar, refusing any member but a plain file or directory whose
    path stays under ``into`` (the rule of the engines' archives, stricter: no links)."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            seen: set[str] = set()
            for m in members:
                name = m.name.removeprefix("./").rstrip("/")
                if m.isdir() and name in ("", "."):
                    continue
                try:
                    check_path(name)
                except BundleError:
                    raise BundleError(
                        f"{archive}: member {m.name!r} would land outside the bundle; "
                        "refused, nothing was imported"
                    ) from None
                if not (m.isreg() or m.isdir()):
                    raise BundleError(
                        f"{archive}: member {m.name!r} is a link or special file; a bundle "
                        "holds plain files only, nothing was imported"
                    )
                if name in seen:
                    raise BundleError(f"{archive}: member {m.name!r} appears twice")
                if m.size > MAX_MEMBER:
                    raise BundleError(f"{archive}: member {m.name!r} is too large")
                seen.add(name)
            for m in members:
                name = m.name.removeprefix("./").rstrip("/")
                if name in ("", "."):
                    continue
                target = into / name
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(m)
                if source is None:
                    raise BundleError(f"{archive}: member {m.name!r} cannot be read")
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as out, source:
                    shutil.copyfileobj(source, out, 1 << 20)
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"{archive} is not a readable tar ({exc})") from None


def sha256_of(path: Path) -> str:
    return release.sha256_file(path)


def check_bundle(
    root: Path,
    *,
    pins: Mapping[str, Mapping[str, object]] | None = None,
    keys: tuple[str, ...] = PUBLIC_KEYS,
    manifest_sha256: str | None = None,
) -> Manifest:
    """The bundle's manifest, once every file of ``root`` checks out."""
    path = root / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(f"{root} has no {MANIFEST}: not an llmgw bundle") from None
    if manifest_sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != manifest_sha256.strip().lower():
            raise BundleError(
                f"{MANIFEST}'s sha256 is {got}, not the {manifest_sha256} carried apart: a "
                "changed bundle, nothing was imported"
            )
    manifest = parse_manifest(data, MANIFEST)
    listed = {f.path for f in manifest.files}
    extra = sorted(_files_under(root) - listed - {MANIFEST})
    if extra:
        raise BundleError(
            f"{extra[0]} is in the bundle but not in its manifest ({len(extra)} such); "
            "nothing was imported"
        )
    for f in manifest.files:
        _check_file(root, f)
    _check_releases(root, manifest, keys)
    _check_pins(manifest, pins or {})
    return manifest


def _files_under(root: Path) -> set[str]:
    found: set[str] = set()
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            found.add((Path(dirpath) / name).relative_to(root).as_posix())
    return found


def _check_file(root: Path, f: BundleFile) -> None:
    path = root / f.path
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise BundleError(f"{f.path} is in the manifest but not in the bundle") from None
    if not path.is_file() or path.is_symlink():
        raise BundleError(f"{f.path} is not a plain file; nothing was imported")
    if not path.resolve().is_relative_to(root.resolve()):
        raise BundleError(
            f"{f.path} lies outside the bundle (through a link); nothing was imported"
        )
    if st.st_size != f.size:
        raise BundleError(
            f"{f.path} is {st.st_size} bytes, the manifest says {f.size}: a changed or cut "
            "file, nothing was imported"
        )
    got = sha256_of(path)
    if got != f.sha256:
        raise BundleError(
            f"{f.path}: sha256 {got} is not the manifest's {f.sha256}: a changed file, "
            "nothing was imported"
        )


def _check_releases(root: Path, manifest: Manifest, keys: tuple[str, ...]) -> None:
    versions = {f.version for f in manifest.files if f.kind.startswith("llmgw")}
    for version in sorted(v for v in versions if v):
        mine = [f for f in manifest.files if f.kind.startswith("llmgw") and f.version == version]
        sums = next((f for f in mine if f.kind == "llmgw-sums"), None)
        sig = next((f for f in mine if f.kind == "llmgw-signature"), None)
        if sums is None or sig is None:
            raise BundleError(
                f"llmgw {version}: the bundle lacks its {release.SUMS} or {release.SIGNATURE}"
            )
        sums_data = (root / sums.path).read_bytes()
        try:
            release.verify_signature(
                sums_data, (root / sig.path).read_bytes(), keys, where=sig.path
            )
            digests = release.parse_sums(sums_data, where=sums.path)
        except release.ReleaseError as exc:
            raise BundleError(f"llmgw {version}: {exc}") from None
        for f in mine:
            if f.kind != "llmgw":
                continue
            name = f.path.rsplit("/", 1)[-1]
            if digests.get(name) != f.sha256:
                raise BundleError(
                    f"{f.path}: its sha256 is not the one the signed {release.SUMS} names; "
                    "nothing was imported"
                )


def _check_pins(manifest: Manifest, pins: Mapping[str, Mapping[str, object]]) -> None:
    for f in manifest.files:
        if f.kind != "engine":
            continue
        want = pins.get(f.engine or "", {})
        digests = want.get("sha256")
        if want.get("version") != f.version or not isinstance(digests, Mapping):
            continue
        asset = f.path.rsplit("/", 1)[-1]
        pinned = digests.get(asset)
        if pinned and str(pinned).lower() != f.sha256:
            raise BundleError(
                f"{f.path}: sha256 {f.sha256} is not the pinned {pinned}: not the engine "
                "build this llmgw names, nothing was imported"
            )


# --- the mirror ------------------------------------------------------------------------


def read_index(mirror: Path) -> Manifest | None:
    """What the mirror holds, or None for an empty mirror."""
    path = mirror / INDEX
    try:
        return parse_manifest(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None


def _fill(root: Path, mirror: Path, manifest: Manifest) -> None:
    mirror.mkdir(parents=True, exist_ok=True)
    for f in manifest.files:
        target = mirror / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.part")
        shutil.copyfile(root / f.path, part)
        os.replace(part, target)
    held = read_index(mirror)
    entries = {f.path: f for f in (held.files if held else [])}
    entries.update({f.path: f for f in manifest.files})
    models = list(dict.fromkeys([*(held.models if held else []), *manifest.models]))
    index = replace(manifest, files=sorted(entries.values(), key=lambda f: f.path), models=models)
    part = mirror / f".{INDEX}.part"
    part.write_bytes(dump_manifest(index))
    os.replace(part, mirror / INDEX)
