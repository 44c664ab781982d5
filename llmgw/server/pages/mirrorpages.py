"""The mirror page (``/admin/mirror``): what this control plane's mirror holds (filled
by ``llmgw bundle import``, served at ``/mirror/`` with ``offline.mirror``): each model
repository with its files, size and format, a pickle-only set marked with how to get
its safetensors; each llama.cpp archive and llmgw release with its sha256; and the
mirrors beyond it (``mirror.api``, ``mirror.peers``), whether each answered when last
asked. It reads ``MirrorFiles.held`` and ``MirrorWatch.states`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, TypedDict

from starlette.responses import Response

from llmgw.modelkit.sources import is_pickled
from llmgw.offline.manifest import BundleFile
from llmgw.offline.mirrorfiles import MirrorHeld
from llmgw.server.mirror import MirrorState
from llmgw.server.pages.frame import Frame, Page, PageCall

Format = Literal["gguf", "safetensors", "pickle", "other"]


class MirrorDesk(Protocol):
    """What the page asks of the mirror (``server/mirror.py``'s ``MirrorFiles``)."""

    def held(self) -> MirrorHeld: ...


class ShownFile(TypedDict):
    path: str
    size: int
    sha256: str
    # The hub published this sha256 (an LFS file); False: the bundle's maker hashed it.
    hub_sha256: bool


class ShownModel(TypedDict):
    repo: str
    files: list[ShownFile]
    size: int
    format: Format
    # Only pickled weights: llmgw refuses them unless a model allows pickles.
    pickle_only: bool


class ShownArchive(TypedDict):
    what: str  # llama.cpp b6000, llmgw 0.2.0
    name: str
    size: int
    sha256: str


class MirrorView(TypedDict):
    models: list[ShownModel]
    archives: list[ShownArchive]
    size: int


def format_of(paths: Sequence[str]) -> Format:
    lowered = [p.lower() for p in paths]
    if any(p.endswith(".gguf") for p in lowered):
        return "gguf"
    if any(p.endswith(".safetensors") for p in lowered):
        return "safetensors"
    if any(is_pickled(p) for p in paths):
        return "pickle"
    return "other"


def _shown(f: BundleFile) -> ShownFile:
    return {
        "path": str(f.repo_path),
        "size": f.size,
        "sha256": f.sha256,
        "hub_sha256": f.hub_sha256,
    }


def mirror_view(held: MirrorHeld) -> MirrorView:
    """The page's rows: models by repository, then engine archives and llmgw releases."""
    repos: dict[str, list[BundleFile]] = {}
    archives: list[ShownArchive] = []
    for f in held.files:
        if f.kind == "model":
            repos.setdefault(str(f.repo), []).append(f)
        elif f.kind in ("engine", "llmgw"):
            what = f"llama.cpp {f.version}" if f.kind == "engine" else f"llmgw {f.version}"
            name = f.path.rsplit("/", 1)[-1]
            archives.append({"what": what, "name": name, "size": f.size, "sha256": f.sha256})
    models: list[ShownModel] = []
    for repo, files in sorted(repos.items()):
        fmt = format_of([str(f.repo_path) for f in files])
        models.append(
            {
                "repo": repo,
                "files": [_shown(f) for f in sorted(files, key=lambda f: str(f.repo_path))],
                "size": sum(f.size for f in files),
                "format": fmt,
                "pickle_only": fmt == "pickle",
            }
        )
    return {
        "models": models,
        "archives": sorted(archives, key=lambda a: (a["what"], a["name"])),
        "size": sum(f.size for f in held.files),
    }


class MirrorsAsked(Protocol):
    """The mirrors beyond the control plane as last asked (``server/mirror.py``)."""

    @property
    def states(self) -> list[MirrorState]: ...


def pages(
    frame: Frame, mirror: MirrorDesk | None, others: MirrorsAsked | None = None
) -> list[Page]:
    async def show(call: PageCall) -> Response:
        view = mirror_view(mirror.held()) if mirror is not None else None
        states = list(others.states) if others is not None else []
        return frame.render(call.request, "mirror.html", call.session, mirror=view, others=states)

    return [Page("GET", "/admin/mirror", show)]
