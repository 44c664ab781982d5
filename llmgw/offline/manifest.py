"""A bundle's manifest and the layout a bundle and a mirror share.

A bundle (a directory, or a tar of one) and the control plane's mirror
(``DATA_DIR/mirror``) lay their files out the same way, so the mirror serves them at
the paths the agents already ask a release source and a hub for:

- ``llmgw/download/v{VERSION}/{ASSET}``, ``SHA256SUMS``, ``SHA256SUMS.sig``: an llmgw
  release in GitHub's layout (``llmgw/release.py``);
- ``llama.cpp/download/{TAG}/{ASSET}``: a llama.cpp release archive (the mirror writes
  ``{ASSET}.sha256`` beside it);
- ``hf/{ORG}/{REPO}/{PATH}``: one file of a Hugging Face repository at ``main``.

``manifest.json`` lists every file: its path, kind, sha256, size and where it came from.
The mirror keeps the union of what was imported as ``index.json``, in the same form; it
serves only the files listed there.

Nothing here does network IO.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, cast

MANIFEST = "manifest.json"
INDEX = "index.json"
FORMAT = 1

Kind = Literal["llmgw", "llmgw-sums", "llmgw-signature", "engine", "model"]
KINDS: tuple[Kind, ...] = ("llmgw", "llmgw-sums", "llmgw-signature", "engine", "model")
# The top directory each kind of file lives under.
TOPS: dict[Kind, str] = {
    "llmgw": "llmgw",
    "llmgw-sums": "llmgw",
    "llmgw-signature": "llmgw",
    "engine": "llama.cpp",
    "model": "hf",
}
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_PART = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,199}\Z")


class BundleError(ValueError):
    """A bundle that cannot be made or used; the message names the file and what to do.
    Nothing was changed."""


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle."""

    path: str  # relative, with / between parts
    kind: Kind
    sha256: str
    size: int
    origin: str  # the URL it was fetched from
    version: str | None = None  # the llmgw version, or the engine's release tag
    engine: str | None = None
    repo: str | None = None  # a model's ORG/REPO
    repo_path: str | None = None  # the file's path in that repository
    # The sha256 is the hub's own (an LFS file); False: the hub lists none for this
    # small file, the bundle's maker hashed what it fetched (its size was the hub's).
    hub_sha256: bool = False


@dataclass(frozen=True)
class Manifest:
    format: int
    created: float
    llmgw_version: str
    files: list[BundleFile] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # the sources as named


def check_path(path: str) -> str:
    """``path`` when it is a plain relative path that stays inside its root; BundleError
    naming it otherwise."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path:
        raise BundleError(f"{path!r} is not a relative path inside the bundle")
    for part in parts:
        if part in ("", ".", "..") or not _PART.match(part):
            raise BundleError(f"{path!r} leaves the bundle or holds an odd name ({part!r})")
    return path


def llmgw_path(version: str, name: str) -> str:
    return f"llmgw/download/v{version}/{name}"


def engine_path(tag: str, asset: str) -> str:
    return f"llama.cpp/download/{tag}/{asset}"


def model_path(repo: str, repo_path: str) -> str:
    return f"hf/{repo}/{repo_path}"


def _entry(raw: object, where: str) -> BundleFile:
    if not isinstance(raw, dict):
        raise BundleError(f"{where}: a file entry is not an object")
    try:
        entry = BundleFile(**raw)
    except TypeError as exc:
        raise BundleError(f"{where}: a file entry has the wrong fields ({exc})") from None
    label = f"{where}: {entry.path!r}"
    if not isinstance(entry.path, str):
        raise BundleError(f"{where}: a file entry's path is not text")
    check_path(entry.path)
    if entry.kind not in KINDS:
        raise BundleError(f"{label}: kind {entry.kind!r} is not one of {', '.join(KINDS)}")
    if not entry.path.startswith(TOPS[entry.kind] + "/"):
        raise BundleError(f"{label}: a {entry.kind} file must lie under {TOPS[entry.kind]}/")
    if not isinstance(entry.sha256, str) or not _HEX64.match(entry.sha256):
        raise BundleError(f"{label}: sha256 must be 64 lower-case hex digits")
    if not isinstance(entry.size, int) or isinstance(entry.size, bool) or entry.size < 0:
        raise BundleError(f"{label}: size must be a whole number of bytes")
    if entry.kind == "model" and not (entry.repo and entry.repo_path):
        raise BundleError(f"{label}: a model file must name its repo and repo_path")
    if entry.kind == "model" and entry.path != model_path(str(entry.repo), str(entry.repo_path)):
        raise BundleError(f"{label}: does not lie where its repository's file goes")
    if entry.kind != "model" and not entry.version:
        raise BundleError(f"{label}: names no version")
    return entry


def parse_manifest(data: bytes, where: str = MANIFEST) -> Manifest:
    """A manifest (or a mirror's index) from its JSON; BundleError naming what is wrong."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{where} is not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{where} is not a JSON object")
    if raw.get("format") != FORMAT:
        raise BundleError(
            f"{where} is format {raw.get('format')!r}; this llmgw reads format {FORMAT}: "
            "make the bundle with this llmgw's `llmgw bundle create`"
        )
    files = raw.get("files")
    if not isinstance(files, list):
        raise BundleError(f"{where} lists no files")
    entries = [_entry(f, where) for f in files]
    seen: set[str] = set()
    for entry in entries:
        if entry.path in seen:
            raise BundleError(f"{where}: {entry.path!r} is listed twice")
        seen.add(entry.path)
    models = raw.get("models", [])
    version = raw.get("llmgw_version")
    created = raw.get("created", 0.0)
    if not isinstance(version, str) or not isinstance(created, int | float):
        raise BundleError(f"{where}: llmgw_version or created is missing")
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise BundleError(f"{where}: models must be a list of sources")
    return Manifest(
        format=FORMAT,
        created=float(created),
        llmgw_version=version,
        files=entries,
        models=cast(list[str], models),
    )


def dump_manifest(manifest: Manifest) -> bytes:
    return (json.dumps(asdict(manifest), indent=1, sort_keys=True) + "\n").encode()


def read_manifest(path: Path) -> Manifest:
    try:
        return parse_manifest(path.read_bytes(), str(path))
    except FileNotFoundError:
        raise BundleError(f"{path} is missing: not an llmgw bundle or mirror") from None
