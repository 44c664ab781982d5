"""What every role must agree on about an engine: which profile arguments it refuses,
which the catalog sets itself, whether it runs on more than one card, and the
arguments that give it a context and a number of slots.

The control plane checks a profile with these rules when it is written; the agent
checks the shard again with the same rules before it starts anything. Neither role
imports the other, so the rules live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.modelkit.enginerules import llamacpp, sglang, vllm
from llmgw.modelkit.enginerules.flags import ArgparseFlags, ExactFlags


class RuleError(ValueError):
    """A profile an engine must not run as written; the message names the fix."""


@dataclass(frozen=True)
class EngineRules:
    name: str
    refused: ExactFlags | ArgparseFlags
    # Set by llmgw from the catalog (context, slots): refused in a profile's arguments
    # so the catalog, the engine and the memory estimate cannot disagree.
    managed: ExactFlags | ArgparseFlags
    # False for an engine given one card per shard; every engine llmgw runs now takes
    # several (llama.cpp splitting its layers across them).
    multi_card: bool
    # True when its cards split the model by tensor (the KV heads must divide evenly).
    tensor_split: bool

    def refused_flag(self, args: Sequence[str]) -> str | None:
        return self.refused.refused_flag(args)

    def context_args(self, context: int, slots: int) -> list[str]:
        """The arguments that give each of ``slots`` requests ``context`` tokens."""
        if self.name == "llama.cpp":
            # llama-server divides --ctx-size among its --parallel slots.
            return ["--ctx-size", str(context * slots), "--parallel", str(slots)]
        if self.name == "vllm":
            return ["--max-model-len", str(context), "--max-num-seqs", str(slots)]
        return ["--context-length", str(context), "--max-running-requests", str(slots)]

    def check(self, args: Sequence[str], cards: int) -> None:
        """Refuse arguments or a card count this engine must not be given."""
        flag = self.refused.refused_flag(args)
        if flag is not None:
            raise RuleError(
                f"{self.name} argument {flag!r} is not allowed: llmgw chooses the model "
                "file, devices and paths itself; remove it from the profile's arguments"
            )
        flag = self.managed.refused_flag(args)
        if flag is not None:
            raise RuleError(
                f"{self.name} argument {flag!r} is set by llmgw from the catalog: use "
                "`llmgw ctl model context MODEL TOKENS [--slots N]` instead"
            )
        if cards > 1 and not self.multi_card:
            raise RuleError(f"{self.name} runs on one card; give the profile 1 card")


RULES: dict[str, EngineRules] = {
    "llama.cpp": EngineRules(
        "llama.cpp",
        ExactFlags(llamacpp.REFUSED),
        ExactFlags(llamacpp.MANAGED),
        multi_card=True,
        tensor_split=False,
    ),
    "vllm": EngineRules(
        "vllm",
        ArgparseFlags((*vllm.OPTIONS, *vllm.MANAGED), vllm.REFUSED, vllm.ALLOWED_VALUES),
        ArgparseFlags((*vllm.OPTIONS, *vllm.REFUSED), vllm.MANAGED),
        multi_card=True,
        tensor_split=True,
    ),
    "sglang": EngineRules(
        "sglang",
        ArgparseFlags((*sglang.OPTIONS, *sglang.MANAGED), sglang.REFUSED),
        ArgparseFlags((*sglang.OPTIONS, *sglang.REFUSED), sglang.MANAGED),
        multi_card=True,
        tensor_split=True,
    ),
}


def rules(engine: str) -> EngineRules:
    try:
        return RULES[engine]
    except KeyError:
        known = ", ".join(sorted(RULES))
        raise RuleError(f"unknown engine {engine!r}; llmgw runs {known}") from None
