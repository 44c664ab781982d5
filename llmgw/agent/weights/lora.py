"""A shard's LoRA adapters on this node: checked, fetched with the weights, resolved.

Each adapter's source is a source like the model's (hf:, https://, a path on the node)
under the same rules: a pickled one is refused unless the model allows pickles, before
anything is fetched, and again on what the fetch found. A fine-tune's stored adapter
(``finetune:NAME``) is no weights source: the fetcher the supervisor is given takes it
from the control plane (``agent/finetune/adapters.py``). ``fetch`` hands back the spec
with each adapter's ``path`` set to what its engine loads (``EngineAdapter.lora_path``:
llama.cpp a GGUF file, vLLM a PEFT directory); the supervisor starts the engine from
that spec and keeps it on disk, so an adopted engine is known by what it loaded.
What a shard reports of its adapters (``reported``) leaves the paths out.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from llmgw.agent.engines.base import EngineAdapter
from llmgw.agent.weights.fetch import Fetcher, ProgressCallback
from llmgw.modelkit.finetuned import PREFIX as FINETUNE
from llmgw.modelkit.sources import (
    WeightsError,
    check_named_pickle,
    normalise_source,
    parse_source,
)
from llmgw.wire.messages import AdapterSpec, ShardSpec


def check(spec: ShardSpec) -> None:
    """Refuse a malformed or (unless the model allows pickles) pickled adapter source
    before anything is installed or fetched; ``WeightsError`` names the adapter."""
    for adapter in spec.adapters:
        if adapter.source.startswith(FINETUNE):
            continue  # a fine-tune's stored adapter: from the control plane, not a hub
        try:
            check_named_pickle(
                parse_source(adapter.source, allow_http=True), allow_pickle=spec.allow_pickle
            )
        except WeightsError as exc:
            raise type(exc)(f"LoRA adapter {adapter.name}: {exc}") from None


async def fetch(
    weights: Fetcher, spec: ShardSpec, engine: EngineAdapter, progress: ProgressCallback
) -> ShardSpec:
    """``spec`` with each adapter fetched into the weights cache (single flight, resumed,
    verified, as any source) and its ``path`` set to what ``engine`` loads."""
    resolved = []
    for adapter in spec.adapters:
        fetched = await weights.fetch(
            adapter.source,
            allow_pickle=spec.allow_pickle,
            replica_id=spec.replica_id,
            progress=progress,
        )
        path = await asyncio.to_thread(engine.lora_path, fetched)
        resolved.append(replace(adapter, path=path))
    return replace(spec, adapters=resolved)


def reported(spec: ShardSpec) -> list[AdapterSpec] | None:
    """The adapters a shard's status says it loaded, in its engine's order: sources in
    the form the weights cache records (the control plane matches them), no paths.
    None for a shard with none."""
    if not spec.adapters:
        return None
    return [AdapterSpec(a.name, _normal(a.source), a.scale) for a in spec.adapters]


def _normal(source: str) -> str:
    try:
        return normalise_source(source)
    except WeightsError:
        return source
