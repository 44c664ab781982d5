"""The control plane's mirror, served read-only at ``/mirror/`` on its listener when
``offline.mirror`` is set: what ``llmgw bundle import`` put in ``DATA_DIR/mirror``, at
the paths an agent already asks a release source and a hub for.

- ``/mirror/llmgw/download/v{V}/{ASSET}``: an llmgw release (GitHub's layout), the
  source ``node add`` and ``ctl upgrade`` fetch from when the cluster is offline;
- ``/mirror/llama.cpp/download/{TAG}/{ASSET}`` and ``{ASSET}.sha256``: llama.cpp's
  release archives, the agents' ``release_source``;
- ``/mirror/hf/api/models/{ORG}/{REPO}/tree/{REV}`` and
  ``/mirror/hf/{ORG}/{REPO}/resolve/{REV}/{PATH}``: a hub, the agents' ``hf_endpoint``.
  Every file of the listing carries its sha256 (the hub's, kept in the bundle), so the
  agent checks each file it fetches; the revision is the one bundled, whatever is asked.

Only files the mirror's ``index.json`` lists are served, each checked when imported;
nothing else under the data dir can be named. ``/mirror/index.json`` is that index (what
a peer mirror follows, and what the control plane asks a mirror to see it answers).
Files are sent with Range (resumed downloads) by aiohttp's file response. No token: the
mirror holds only public, checksummed files, as a release page does.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from aiohttp import web

from llmgw.modelkit.sources import SourceError, parse_source
from llmgw.offline.manifest import (
    INDEX,
    BundleError,
    BundleFile,
    Manifest,
    dump_manifest,
    parse_manifest,
)

log = logging.getLogger("llmgw.mirror")

PREFIX = "/mirror/"
RELEASES = "llmgw"
ENGINES = "llama.cpp"
HUB = "hf"


@dataclass(frozen=True)
class MirrorHeld:
    """What the mirror holds, for the mirror page and the agents' checksums."""

    files: list[BundleFile]
    models: list[str]


def mirror_urls(base: str) -> dict[str, str]:
    """The sources an agent (and ``node add``) is given for a mirror at ``base``
    (``http://HOST:PORT``)."""
    root = base.rstrip("/") + PREFIX.rstrip("/")
    return {
        "release_source": f"{root}/{ENGINES}",
        "hf_endpoint": f"{root}/{HUB}",
        "llmgw_source": f"{root}/{RELEASES}",
    }


def url_path(f: BundleFile) -> str:
    """Where a mirror serves ``f``, from its ``/mirror/``."""
    if f.kind == "model":
        return f"{HUB}/{f.repo}/resolve/main/{f.repo_path}"
    return f.path


class MirrorFiles:
    """``DATA_DIR/mirror``'s index, read again whenever it changes on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp: tuple[int, int] | None = None
        self._index: Manifest | None = None
        self._by_path: dict[str, BundleFile] = {}

    def index(self) -> Manifest | None:
        path = self.root / INDEX
        try:
            st = path.stat()
        except FileNotFoundError:
            self._stamp, self._index, self._by_path = None, None, {}
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._index = parse_manifest(path.read_bytes(), str(path))
            except (OSError, BundleError) as exc:
                log.warning("the mirror's index cannot be read (%s); serving nothing", exc)
                self._index = None
            self._by_path = {f.path: f for f in self._index.files} if self._index else {}
            self._stamp = stamp
        return self._index

    def held(self) -> MirrorHeld:
        index = self.index()
        return (
            MirrorHeld(files=list(index.files), models=list(index.models))
            if index
            else (MirrorHeld(files=[], models=[]))
        )

    def file(self, path: str) -> BundleFile | None:
        self.index()
        return self._by_path.get(path)

    def engine_digests(self, tag: str) -> dict[str, str]:
        """``{asset: sha256}`` of llama.cpp release ``tag``'s archives the mirror holds:
        what the agents check what they fetch from it against (sent over the stream)."""
        index = self.index()
        if index is None:
            return {}
        return {
            f.path.rsplit("/", 1)[-1]: f.sha256
            for f in index.files
            if f.kind == "engine" and f.version == tag
        }

    def digests_of(self, source: str) -> dict[str, str]:
        """``{path: sha256}`` of the files the mirror holds of an ``hf:`` source's
        repository (nothing for another source, or one it does not hold)."""
        try:
            parsed = parse_source(source)
        except SourceError:
            return {}
        if parsed.kind != "hf" or parsed.repo is None:
            return {}
        return {str(f.repo_path): f.sha256 for f in self.listing(parsed.repo)}

    def listing(self, repo: str) -> list[BundleFile]:
        index = self.index()
        lowered = repo.lower()
        return [
            f
            for f in (index.files if index else [])
            if f.kind == "model" and (f.repo or "").lower() == lowered
        ]

    # --- HTTP -----------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return _error(405, "the mirror is read-only")
        rest = unquote(request.path[len(PREFIX) :])
        if rest == INDEX:
            index = self.index()
            if index is None:
                return _error(404, "the mirror holds nothing yet")
            return web.Response(body=dump_manifest(index), content_type="application/json")
        parts = rest.split("/")
        if parts[0] == HUB:
            return await self._hub(request, parts[1:])
        if parts[0] in (RELEASES, ENGINES):
            if parts[0] == ENGINES and rest.endswith(".sha256"):
                held = self.file(rest.removesuffix(".sha256"))
                if held is not None:
                    name = held.path.rsplit("/", 1)[-1]
                    return web.Response(text=f"{held.sha256}  {name}\n")
            return await self._send(request, self.file(rest))
        return _error(404, f"the mirror holds nothing at {request.path}")

    async def _hub(self, request: web.BaseRequest, parts: list[str]) -> web.StreamResponse:
        # api/models/ORG/REPO/tree/REV
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
            repo = f"{parts[2]}/{parts[3]}"
            files = self.listing(repo)
            if not files:
                return _error(404, f"the mirror holds no files of {repo}", "RepoNotFound")
            body = [
                {
                    "type": "file",
                    "path": f.repo_path,
                    "size": f.size,
                    "lfs": {"oid": f.sha256, "size": f.size},
                }
                for f in files
            ]
            return web.Response(text=json.dumps(body), content_type="application/json")
        # ORG/REPO/resolve/REV/PATH
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = f"{parts[0]}/{parts[1]}"
            path = "/".join(parts[4:])
            found = next((f for f in self.listing(repo) if f.repo_path == path), None)
            if found is None:
                return _error(404, f"the mirror holds no {path} of {repo}", "EntryNotFound")
            return await self._send(request, found)
        return _error(404, "not a hub path the mirror answers")

    async def _send(self, request: web.BaseRequest, held: BundleFile | None) -> web.StreamResponse:
        if held is None:
            return _error(404, f"the mirror holds nothing at {request.path}")
        path = self.root / held.path
        if not path.is_file():
            return _error(404, f"{held.path} is in the mirror's index but not on its disk")
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})


def _error(status: int, message: str, code: str = "") -> web.Response:
    headers = {"X-Error-Message": message}
    if code:
        headers["X-Error-Code"] = code
    return web.Response(status=status, text=message + "\n", headers=headers)
