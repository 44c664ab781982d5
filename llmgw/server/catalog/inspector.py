"""What a source is, learnt without fetching its weights.

``Inspector`` reads a local path where it is (here, or by a node that has it), a hub
repository from its listing and the first bytes of its GGUF header (HTTP Range), a
safetensors repository from its config.json and the listed sizes. ``make_inspector``
asks the nodes through their streams (``weights.inspect``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from llmgw.modelkit.files import (
    NeedMore,
    ShapeError,
    combine_parts,
    gguf_header_length,
    inspect_local,
    shape_from_gguf_prefix,
    shape_from_json,
    shape_to_json,
)
from llmgw.modelkit.hub import HubClient, HubError, HubFile, NetworkError, is_gguf, select_files
from llmgw.modelkit.sizing import (
    ModelShape,
    shape_from_config,
)
from llmgw.modelkit.sources import (
    PickleRefused,
    Source,
    SourceError,
    check_named_pickle,
    is_pickled,
    parse_source,
    pickle_refusal,
)

if TYPE_CHECKING:
    from llmgw.server.fleet.registry import NodeRegistry

log = logging.getLogger("llmgw.planner")

Format = Literal["gguf", "safetensors", "pickle"]
AskNode = Callable[[str], Awaitable[dict[str, Any] | None]]
# The first read of a GGUF: most headers (vocabulary included) fit in a few MiB.
HEADER_FIRST_READ = 4 * 1024 * 1024
HEADER_MAX_READ = 512 * 1024 * 1024
CONFIG_MAX_BYTES = 8 * 1024 * 1024
# A context for a model whose files do not name its trained one.
NODE_ASK_TIMEOUT = 30.0


class PlanError(ValueError):
    """A plan that cannot be made as asked; the message says what and the fix."""


class PickledWeights(PlanError):
    """The source holds only Python pickles, and the model did not allow them."""


class InspectionJson(TypedDict):
    source: str
    format: Format
    # The shape's every field (``modelkit.files.shape_to_json``), unknown ones null.
    shape: dict[str, Any]
    weight_bytes: int
    files: list[str]


@dataclass(frozen=True)
class Inspection:
    """What a source is: its normal form, format, shape, bytes of weights and files."""

    source: str
    format: Format
    shape: ModelShape
    weight_bytes: int
    files: tuple[str, ...]

    def as_json(self) -> InspectionJson:
        return {
            "source": self.source,
            "format": self.format,
            "shape": shape_to_json(self.shape),
            "weight_bytes": self.weight_bytes,
            "files": list(self.files),
        }


def inspection_from_answer(source: str, data: dict[str, Any]) -> Inspection:
    """An Inspection from a node's ``weights.inspect`` answer (or ``inspect_local``)."""
    fmt = data.get("format")
    if fmt not in ("gguf", "safetensors", "pickle"):
        raise PlanError(f"{source}: the node answered an unknown format {fmt!r}")
    try:
        shape = shape_from_json(data)
    except ShapeError as exc:
        raise PlanError(f"{source}: the node's answer is not a shape: {exc}") from None
    files = data.get("files") or []
    return Inspection(
        source=source,
        format=fmt,
        shape=shape,
        weight_bytes=int(data.get("weight_bytes") or shape.file_bytes),
        files=tuple(str(f) for f in files),
    )


class Inspector:
    """Reads sources' shapes, each once: a source's files do not change under its name."""

    def __init__(
        self,
        hub_endpoint: str | None = None,
        hub_token: str | None = None,
        ask_node: AskNode | None = None,
        *,
        environ: dict[str, str] | None = None,
        first_read: int = HEADER_FIRST_READ,
    ) -> None:
        self._hub = HubClient(hub_endpoint, hub_token, environ=environ)
        self._ask_node = ask_node
        self._first_read = first_read
        self._cache: dict[str, Inspection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Bytes of file bodies read so far (headers, configs): tests check it stays small.
        self.bytes_read = 0

    async def close(self) -> None:
        await self._hub.close()

    async def inspect(self, source: str, *, allow_pickle: bool = False) -> Inspection:
        try:
            src = parse_source(source)
            check_named_pickle(src, allow_pickle=allow_pickle)
        except (SourceError, PickleRefused) as exc:
            raise PlanError(str(exc)) from None
        lock = self._locks.setdefault(src.text, asyncio.Lock())
        async with lock:
            found = self._cache.get(src.text)
            if found is None:
                found = await self._inspect(src)
                self._cache[src.text] = found
        if found.format == "pickle" and not allow_pickle:
            raise PickledWeights(str(pickle_refusal(src.text, list(found.files))))
        return found

    async def _inspect(self, src: Source) -> Inspection:
        if src.kind == "local":
            assert src.path is not None
            if src.path.exists():
                try:
                    data = await asyncio.to_thread(inspect_local, src.path, allow_pickle=True)
                except ShapeError as exc:
                    raise PlanError(str(exc)) from None
                return inspection_from_answer(src.text, data)
            return await self._from_nodes(
                src, f"{src.text} is not on the control plane and no connected node holds it"
            )
        try:
            if src.kind == "hf":
                return await self._from_hub(src)
            return await self._from_url(src)
        except NetworkError as exc:
            # A control plane without the internet: a node may hold the files already.
            return await self._from_nodes(src, f"{src.text}: {exc}")
        except (HubError, SourceError, ShapeError) as exc:
            raise PlanError(str(exc)) from None

    async def _from_nodes(self, src: Source, why: str) -> Inspection:
        answer = await self._ask_node(src.text) if self._ask_node is not None else None
        if answer is None:
            raise PlanError(
                f"{why}; give a path that exists on a connected node, or a hub or https "
                "source the control plane can reach"
            )
        return inspection_from_answer(src.text, answer)

    async def _from_hub(self, src: Source) -> Inspection:
        assert src.repo is not None
        listing = await self._hub.list_files(src.repo)
        selection = select_files(src, listing)
        files = selection.files
        # The projector rides along for the engine; the model's shape is the model's.
        ggufs = [f for f in files if is_gguf(f.path) and f.path != selection.projector]
        if ggufs:
            shapes = []
            for f in ggufs:
                url = self._hub.resolve_url(src.repo, f.path)
                shapes.append(await self._gguf_shape(url, f.size, repo=src.repo, path=f.path))
            sizes = [s.file_bytes for s in shapes]
            shape = combine_parts(shapes, sizes)
            return Inspection(
                src.text, "gguf", shape, shape.file_bytes, tuple(f.path for f in ggufs)
            )
        weights = [f for f in files if f.path.lower().endswith(".safetensors")]
        fmt: Format = "safetensors"
        if not weights:
            weights = [f for f in files if is_pickled(f.path)]
            fmt = "pickle"
        config = next((f for f in files if f.path == "config.json"), None)
        if config is None:
            raise PlanError(
                f"{src.text}: the repository has no config.json beside its weights, so its "
                "shape is unknown; name a GGUF file (hf:ORG/REPO:QUANT) instead"
            )
        config_json = await self._config(src.repo, config)
        size = sum(f.size or 0 for f in weights)
        if any(f.size is None for f in weights):
            raise PlanError(f"{src.text}: the hub listed weights without sizes")
        shape = shape_from_config(config_json, size)
        return Inspection(src.text, fmt, shape, size, tuple(f.path for f in weights))

    async def _config(self, repo: str, config: HubFile) -> dict[str, Any]:
        url = self._hub.resolve_url(repo, config.path)
        data, _ = await self._hub.read_range(url, 0, CONFIG_MAX_BYTES, repo=repo, path=config.path)
        self.bytes_read += len(data)
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise PlanError(f"hf:{repo}: config.json is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise PlanError(f"hf:{repo}: config.json is not a JSON object")
        return parsed

    async def _from_url(self, src: Source) -> Inspection:
        assert src.url is not None and src.filename is not None
        if not is_gguf(src.filename):
            raise PlanError(
                f"{src.text}: only a .gguf file is planned from a URL (its header says its "
                "shape); use an hf: source or a local directory for other formats"
            )
        shape = await self._gguf_shape(src.url, None)
        return Inspection(src.text, "gguf", shape, shape.file_bytes, (src.filename,))

    async def _gguf_shape(
        self, url: str, size: int | None, *, repo: str | None = None, path: str | None = None
    ) -> ModelShape:
        """Read a GGUF's first bytes, more until the header is whole, and read it."""
        buf = b""
        want = self._first_read
        total = size
        while True:
            data, said = await self._hub.read_range(url, len(buf), want, repo=repo, path=path)
            self.bytes_read += len(data)
            buf += data
            total = total or said
            try:
                length = gguf_header_length(buf)
                break
            except NeedMore as more:
                if not data or (total is not None and len(buf) >= total):
                    raise PlanError(
                        f"{path or url}: the file ends inside its GGUF header"
                    ) from None
                want = max(more.needed, 2 * want)
                if want > HEADER_MAX_READ:
                    raise PlanError(
                        f"{path or url}: the GGUF header runs past {HEADER_MAX_READ} bytes"
                    ) from None
        if total is None:
            raise PlanError(f"{path or url}: the server did not say the file's size")
        return await asyncio.to_thread(shape_from_gguf_prefix, buf[:length], total)


# ------------------------------------------------------------------------------ plan


def make_inspector(registry: NodeRegistry, hub_endpoint: str | None = None) -> Inspector:
    """An Inspector whose nodes are asked through their streams (``weights.inspect``);
    ``hub_endpoint``: the hub it reads (offline, the control plane's own mirror)."""

    async def ask_one(node_id: str, source: str) -> dict[str, Any] | None:
        view = registry.nodes.get(node_id)
        if view is None or view.session is None:
            return None
        try:
            async for answer in view.session.ask(
                "weights.inspect", {"source": source}, timeout=NODE_ASK_TIMEOUT
            ):
                if answer.ok and isinstance(answer.result, dict):
                    return {**answer.result, "node": node_id}
                return None
        except (TimeoutError, ConnectionError) as exc:
            log.info("node %s could not inspect %s: %s", node_id, source, exc)
        return None

    async def ask_node(source: str) -> dict[str, Any] | None:
        ids = sorted(i for i, v in registry.nodes.items() if v.session is not None)
        answers = await asyncio.gather(*(ask_one(i, source) for i in ids))
        return next((a for a in answers if a is not None), None)

    return Inspector(hub_endpoint, ask_node=ask_node)
