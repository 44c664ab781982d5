"""Engine adapters by name, and the one lookup the agent uses.

Provisioning (installing llama.cpp, engines named on purpose) lives in
``llmgw.agent.engines.install`` and ``llmgw.agent.engines.provision``.
"""

from __future__ import annotations

from llmgw.agent.engines.base import EngineAdapter, EngineError, wait_ready
from llmgw.agent.engines.freetoken import FreeTokenAdapter
from llmgw.agent.engines.llamacpp import LlamaCppAdapter
from llmgw.agent.engines.sglang import SglangAdapter
from llmgw.agent.engines.tensorrt import TensorRtLlmAdapter
from llmgw.agent.engines.vllm import VllmAdapter

__all__ = ["ADAPTERS", "EngineAdapter", "EngineError", "adapter", "wait_ready"]

ADAPTERS: dict[str, EngineAdapter] = {
    a.name: a
    for a in (
        LlamaCppAdapter(),
        VllmAdapter(),
        SglangAdapter(),
        FreeTokenAdapter(),
        TensorRtLlmAdapter(),
    )
}


def adapter(name: str) -> EngineAdapter:
    """The adapter for an engine name, or EngineError naming the ones there are."""
    try:
        return ADAPTERS[name]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise EngineError(f"unknown engine {name!r}; this agent knows {known}") from None
