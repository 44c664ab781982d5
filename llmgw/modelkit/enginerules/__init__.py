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

from llmgw.modelkit.enginerules import freetoken, llamacpp, sglang, tensorrt, vllm
from llmgw.modelkit.enginerules.flags import ArgparseFlags, ExactFlags

EXPERT_PARALLEL = "--enable-expert-parallel"


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
    # False for an engine that runs on cards only (no CPU build).
    runs_on_cpu: bool = True
    # False for an engine llmgw runs a replica of on one node only.
    spans_nodes: bool = True
    # Keeps a mixture of experts' experts in host memory, the rest on its card.
    experts_in_ram: bool = False
    # What a card and its host must be for it; None where any will do.
    min_compute: tuple[int, int] | None = None
    min_driver: int | None = None
    arches: tuple[str, ...] | None = None
    # Variables of its own a profile's environment may not set (``engineenv``).
    refused_env: frozenset[str] = frozenset()

    def refused_flag(self, args: Sequence[str]) -> str | None:
        return self.refused.refused_flag(args)

    def context_args(self, context: int, slots: int) -> list[str]:
        """The arguments that give each of ``slots`` requests ``context`` tokens."""
        if self.name == "llama.cpp":
            # llama-server divides --ctx-size among its --parallel slots.
            return ["--ctx-size", str(context * slots), "--parallel", str(slots)]
        if self.name == "vllm":
            return ["--max-model-len", str(context), "--max-num-seqs", str(slots)]
        if self.name == "freetoken":
            return ["--max-seq-len-override", str(context), "--max-running-requests", str(slots)]
        if self.name == "tensorrt-llm":
            return ["--max_seq_len", str(context), "--max_batch_size", str(slots)]
        return ["--context-length", str(context), "--max-running-requests", str(slots)]

    def layout_args(self, args: Sequence[str], cards: int, moe: bool) -> list[str]:
        """What a replica on ``cards`` cards in all adds for its layout, whoever chose
        it: vLLM spreads a mixture of experts' experts over the cards
        (``--enable-expert-parallel``) rather than cutting each expert's tensors."""
        if self.name == "vllm" and moe and cards > 1 and EXPERT_PARALLEL not in args:
            return [EXPERT_PARALLEL]
        return []

    def check(self, args: Sequence[str], cards: int, nodes: int = 1) -> None:
        """Refuse arguments, a card count or a node count this engine must not be given."""
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
        if cards == 0 and not self.runs_on_cpu:
            raise RuleError(f"{self.name} runs on cards only; give the profile 1 card or more")
        if nodes > 1 and not self.spans_nodes:
            raise RuleError(
                f"llmgw runs a {self.name} replica on one node; give the profile 1 node "
                "(serve a larger model with vllm or sglang across nodes)"
            )

    def card_refusal(self, compute: str | None, driver: str | None) -> str | None:
        """Why this engine cannot use a card of that compute capability and driver
        version (as NVML says them, "8.6" and "580.65.06"); None when it can. A figure
        the node did not report is not held against it."""
        if self.min_compute is not None and compute:
            found = _numbers(compute)
            if found is not None and found < self.min_compute:
                need = ".".join(map(str, self.min_compute))
                return f"compute capability {compute}, {self.name} needs {need} or more"
        if self.min_driver is not None and driver:
            major = _numbers(driver)
            if major is not None and major[0] < self.min_driver:
                return f"driver {driver}, {self.name} needs {self.min_driver} or later"
        return None

    def host_refusal(self, arch: str | None) -> str | None:
        """Why this engine cannot run on a host of that machine type; None when it can
        (or the node did not say)."""
        if self.arches is None or not arch:
            return None
        if arch.lower() in {"amd64", "x64"}:
            arch = "x86_64"
        if arch.lower() not in self.arches:
            return f"{self.name} runs on {', '.join(self.arches)} hosts; this one is {arch}"
        return None


def _numbers(version: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(n) for n in version.strip().split(".")[:2])
    except ValueError:
        return None


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
    "freetoken": EngineRules(
        "freetoken",
        ArgparseFlags(
            (*freetoken.OPTIONS, *freetoken.MANAGED), freetoken.REFUSED, freetoken.ALLOWED_VALUES
        ),
        ArgparseFlags((*freetoken.OPTIONS, *freetoken.REFUSED), freetoken.MANAGED),
        multi_card=False,
        tensor_split=False,
        runs_on_cpu=False,
        spans_nodes=False,
        experts_in_ram=True,
        min_compute=freetoken.MIN_COMPUTE,
        min_driver=freetoken.MIN_DRIVER,
        arches=freetoken.ARCHES,
        refused_env=frozenset(freetoken.REFUSED_ENV),
    ),
    "tensorrt-llm": EngineRules(
        "tensorrt-llm",
        ExactFlags(tensorrt.REFUSED),
        ExactFlags(tensorrt.MANAGED),
        multi_card=True,
        tensor_split=True,
        runs_on_cpu=False,
        spans_nodes=False,
    ),
}


def rules(engine: str) -> EngineRules:
    try:
        return RULES[engine]
    except KeyError:
        known = ", ".join(sorted(RULES))
        raise RuleError(f"unknown engine {engine!r}; llmgw runs {known}") from None
