"""Where a fetched model's multimodal projector is, and whether the model takes images.

A source fetched into the cache holds the projector its selection chose (the cache
directory's manifest lists it, wherever in the repository's layout it lies); a local
GGUF file's projector lies beside it, chosen among several as
``llmgw.modelkit.projector`` says. A safetensors directory has no projector: its
``config.json`` says whether it takes images. Blocking; call through
``asyncio.to_thread``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from llmgw.agent.weights.cache import COMPLETE_MARKER, read_manifest
from llmgw.modelkit.projector import choose_projector, is_projector, takes_images_config
from llmgw.wire.messages import ShardSpec

# A config.json is a few KB; past this it is not one worth reading for a yes or no.
_CONFIG_MAX = 4 * 2**20


def find_projector(model: Path) -> Path | None:
    """The projector to give llama.cpp with the GGUF file ``model``; None for none (or
    for a model that is a directory)."""
    if not model.is_file():
        return None
    root = _cache_root(model)
    if root is not None:
        manifest = read_manifest(root)
        if manifest is not None:
            entry = model.relative_to(root).as_posix()
            chosen = choose_projector([f.path for f in manifest.files], entry)
            found = root / chosen if chosen else None
            return found if found is not None and found.is_file() else None
    try:
        names = [p.name for p in model.parent.iterdir() if p.is_file() and is_projector(p.name)]
    except OSError:
        return None
    chosen = choose_projector(names, model.name)
    return model.parent / chosen if chosen else None


def _cache_root(model: Path) -> Path | None:
    """The cache directory of a fetched source holding ``model``, found by its manifest
    in the file's folder or one above it."""
    for folder in model.parents:
        if (folder / COMPLETE_MARKER).is_file():
            return folder
    return None


def config_takes_images(directory: Path) -> bool:
    """Whether the safetensors model in ``directory`` takes images, by its config.json."""
    config = directory / "config.json"
    try:
        if config.stat().st_size > _CONFIG_MAX:
            return False
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and takes_images_config(data)


def prepare(spec: ShardSpec, reads: str | None, model: Path) -> tuple[ShardSpec, bool]:
    """The spec to start the engine from, and whether the replica takes images.

    ``reads``: how the engine takes images (``EngineAdapter.images``): "projector"
    (llama.cpp: the spec gets the projector found for ``model``, or none), "config"
    (vLLM, SGLang: the model's own config.json says), None (no images)."""
    if reads == "projector":
        found = find_projector(model)
        return replace(spec, projector=str(found) if found else None), found is not None
    if reads == "config":
        return spec, model.is_dir() and config_takes_images(model)
    return spec, False
