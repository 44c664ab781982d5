"""What the explorer judges of a hub repository: its file sets and their sizes, from the
hub's own figures. Pure: no network, no fleet.

- **The listing** gives no file sizes, so a repository is judged at one headline set:
  a GGUF repository at Q4_K_M from its parameter count (``gguf.total`` x 4.9 bits, the
  Q4_K_M of llama.cpp's quantiser: Llama-3.1-8B's 8.03 B parameters are 4.92 GB, 4.90
  bits each), a safetensors one at the size its dtype breakdown gives (each dtype's
  count x its width: packed AWQ and GPTQ weights are counted as the I32 words they are
  stored in, MXFP4 as its U8 bytes, so both come to about four bits a weight).
- **A repository's page** has its files with their sizes (the tree listing): each GGUF
  quantisation is a set (a split GGUF's parts together; projectors left out, as the
  planner leaves them out of a model's bytes), and the safetensors are one set.

A set is FP8 when its config says ``quant_method: fp8`` or most of its parameters are
an ``F8_*`` dtype: such a set is judged only on cards of compute capability 8.9 or more.
MLX weights run only on Apple silicon: never judged. Python pickles are left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from llmgw.modelkit.hub import HubFile, is_gguf, split_key
from llmgw.modelkit.hublist import HubRepo
from llmgw.modelkit.projector import is_projector
from llmgw.wire.admin.explore import ExploreFormat

# Q4_K_M's bits per weight, measured on llama.cpp's files (module docstring).
Q4_K_M_BITS = 4.9
HEADLINE_QUANT = "Q4_K_M"
# Bytes per element of each safetensors dtype, as the hub names them.
DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "BF16": 2,
    "F16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 0.5,
}
FOUR_BIT_METHODS = ("awq", "gptq", "mxfp4")
# llama.cpp's quantisation names as they appear in file names, longest first.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"IQ[1-4]_(?:XXS|XS|S|M|NL)|TQ[12]_0|MXFP4(?:_MOE)?|"
    r"Q[2-8]_K(?:_XL|_[SML])?|Q[4-8]_[01]|BF16|F16|F32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


class NotJudged(ValueError):
    """A repository or set the explorer cannot size; the message says why."""


@dataclass(frozen=True)
class Candidate:
    """One file set to judge: what to call it, what serves it, its bytes and shape."""

    repo: str
    name: str
    format: Literal["gguf", "safetensors"]
    # The source `ctl model serve` takes; None: the set is an estimate the repository
    # may not hold (a Q4_K_M the listing cannot show).
    source: str | None
    bytes: int
    parameters: int | None
    trained_context: int | None
    architecture: str | None
    fp8: bool = False
    files: tuple[str, ...] = ()


def repo_format(repo: HubRepo) -> ExploreFormat:
    if repo.gguf is not None or repo.library_name == "gguf" or "gguf" in repo.tags:
        return "gguf"
    if repo.safetensors is not None or "safetensors" in repo.tags:
        return "safetensors"
    return "other"


def is_mlx(repo: HubRepo) -> bool:
    return repo.library_name == "mlx" or "mlx" in repo.tags


def parameters_of(repo: HubRepo) -> int | None:
    if repo.gguf is not None and repo.gguf.total:
        return repo.gguf.total
    if repo.safetensors is not None:
        return repo.safetensors.total or sum(repo.safetensors.parameters.values()) or None
    return None


def is_fp8(repo: HubRepo) -> bool:
    if repo.quant_method == "fp8":
        return True
    if repo.safetensors is None:
        return False
    counts = repo.safetensors.parameters
    eight = sum(n for d, n in counts.items() if d.startswith("F8_") and d != "F8_E8M0")
    return eight * 2 > sum(counts.values())


def precision(repo: HubRepo) -> str:
    """What a safetensors repository's weights are: 4-bit AWQ, FP8, BF16..."""
    method = repo.quant_method
    if method in FOUR_BIT_METHODS or "awq" in repo.tags or "gptq" in repo.tags:
        return f"4-bit {(method or next(t for t in repo.tags if t in ('awq', 'gptq'))).upper()}"
    if is_fp8(repo):
        return "FP8"
    if method:
        bits = f"{repo.quant_bits}-bit " if repo.quant_bits else ""
        return f"{bits}{method}"
    assert repo.safetensors is not None
    counts = repo.safetensors.parameters
    return max(counts, key=lambda d: counts[d])


def safetensors_bytes(repo: HubRepo) -> int:
    assert repo.safetensors is not None
    unknown = sorted(d for d in repo.safetensors.parameters if d not in DTYPE_BYTES)
    if unknown:
        raise NotJudged(f"the hub counts parameters of dtype {', '.join(unknown)}, unknown here")
    return int(sum(n * DTYPE_BYTES[d] for d, n in repo.safetensors.parameters.items()))


def _not_servable(repo: HubRepo) -> None:
    if is_mlx(repo):
        raise NotJudged("MLX weights run only on Apple silicon; no llmgw engine serves them")


def headline(repo: HubRepo) -> Candidate:
    """The set a listed repository is judged at, or ``NotJudged``."""
    _not_servable(repo)
    fmt = repo_format(repo)
    context = repo.gguf.context_length if repo.gguf is not None else None
    arch = repo.gguf.architecture if repo.gguf is not None else repo.model_type
    if fmt == "gguf":
        params = parameters_of(repo)
        if params is None:
            raise NotJudged("the hub did not read its GGUF header (no parameter count)")
        quant = _quant_pattern(HEADLINE_QUANT)
        held = any(
            quant.search(PurePosixPath(f).name) and not is_projector(f)
            for f in repo.siblings
            if is_gguf(f)
        )
        return Candidate(
            repo=repo.id,
            name=HEADLINE_QUANT,
            format="gguf",
            source=f"hf:{repo.id}:{HEADLINE_QUANT}" if held else None,
            bytes=int(params * Q4_K_M_BITS / 8),
            parameters=params,
            trained_context=context,
            architecture=arch,
        )
    if fmt == "safetensors":
        if repo.safetensors is None:
            raise NotJudged("the hub gives no dtype breakdown of its safetensors")
        return Candidate(
            repo=repo.id,
            name=precision(repo),
            format="safetensors",
            source=f"hf:{repo.id}",
            bytes=safetensors_bytes(repo),
            parameters=parameters_of(repo),
            trained_context=context,
            architecture=arch,
            fp8=is_fp8(repo),
        )
    raise NotJudged("neither GGUF nor safetensors: no engine of llmgw serves it")


def _quant_pattern(quant: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)


def quant_of(path: str) -> str | None:
    """The quantisation a GGUF's file name carries (Q4_K_M, IQ4_XS, BF16), upper case."""
    found = _QUANT.findall(PurePosixPath(path).name)
    return found[-1].upper() if found else None


def file_sets(repo: HubRepo, files: Sequence[HubFile]) -> list[Candidate]:
    """Each set of a repository's files that llmgw serves, smallest first."""
    _not_servable(repo)
    visible = [f for f in files if not any(p.startswith(".") for p in f.path.split("/"))]
    params = parameters_of(repo)
    context = repo.gguf.context_length if repo.gguf is not None else None
    arch = repo.gguf.architecture if repo.gguf is not None else repo.model_type
    sets: list[Candidate] = []
    groups: dict[str, list[HubFile]] = {}
    for f in visible:
        if is_gguf(f.path) and not is_projector(f.path):
            key = split_key(f.path)
            groups.setdefault(f"{key[0]}@{key[2]}" if key else f.path, []).append(f)
    by_quant: dict[str, int] = {}
    for group in groups.values():
        quant = quant_of(group[0].path)
        if quant is not None:
            by_quant[quant] = by_quant.get(quant, 0) + 1
    for group in groups.values():
        group.sort(key=lambda f: f.path)
        quant = quant_of(group[0].path)
        # A quantisation two sets share is named by its file, as serve would ask.
        named = quant if quant is not None and by_quant[quant] == 1 else None
        source = f"hf:{repo.id}:{named}" if named else f"hf:{repo.id}:{group[0].path}"
        if any(f.size is None for f in group):
            continue
        sets.append(
            Candidate(
                repo=repo.id,
                name=named or PurePosixPath(group[0].path).name,
                format="gguf",
                source=source,
                bytes=sum(f.size or 0 for f in group),
                parameters=params,
                trained_context=context,
                architecture=arch,
                files=tuple(f.path for f in group),
            )
        )
    weights = [f for f in visible if f.path.lower().endswith(".safetensors")]
    if weights and all(f.size is not None for f in weights):
        sets.append(
            Candidate(
                repo=repo.id,
                name=precision(repo) if repo.safetensors is not None else "safetensors",
                format="safetensors",
                source=f"hf:{repo.id}",
                bytes=sum(f.size or 0 for f in weights),
                parameters=params,
                trained_context=context,
                architecture=arch,
                fp8=is_fp8(repo),
                files=tuple(sorted(f.path for f in weights)),
            )
        )
    return sorted(sets, key=lambda c: (c.bytes, c.name))
