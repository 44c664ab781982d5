"""Variables a model's profile sets in its engines' environment (``ctl model serve
--env K=V``), and the ones it may not.

The control plane checks them when a profile is written and the agent again before an
engine starts, with this one rule, so neither role trusts the other's word. Refused:

- the agent's own settings (``LLMGW_*``) and what llmgw sets for the engine itself:
  the key variables, the cards (``CUDA_VISIBLE_DEVICES`` and its kin), the hub kept
  offline, NCCL's multi-node NVLink switches;
- what changes which code runs or where it is loaded from: ``LD_PRELOAD``,
  ``LD_LIBRARY_PATH``, ``PYTHONPATH`` and the like (any ``LD_*``, ``PYTHON*`` and
  ``DYLD_*``), ``PATH``, ``HOME``;
- an engine's own variables that name files or its key (``enginerules``' ``refused_env``);
- a value naming a path outside the replica's directory: absolute, from a home
  directory (``~``), climbing out (``..``) or a ``file:`` URL. A relative path is read
  from the engine's working directory, the replica's own.

A name is upper-case letters, digits and ``_`` (as shells write them), a value at most
4096 characters with no line break or NUL; at most 64 of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llmgw.modelkit.enginerules import RULES

MAX_VARIABLES = 64
MAX_VALUE = 4096
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

# Exactly these names.
RESERVED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "SHELL",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HOME",
        "VLLM_API_KEY",
        "LLAMA_API_KEY",
        "VLLM_NO_USAGE_STATS",
        "DO_NOT_TRACK",
        "NCCL_MNNVL_ENABLE",
        "NCCL_CUMEM_ENABLE",
        "BASH_ENV",
        "ENV",
        "PERL5LIB",
        "NODE_OPTIONS",
        "GCONV_PATH",
        "TRITON_CACHE_DIR",
    }
)
# Names beginning so: the agent's own, the dynamic loader's, and Python's.
RESERVED_PREFIXES = ("LLMGW_", "LD_", "DYLD_", "PYTHON")


class EnvError(ValueError):
    """A variable a profile may not set; the message names it and what to do."""


def refusal(engine: str, name: str, value: str) -> str | None:
    """Why ``name=value`` may not be set in ``engine``'s environment; None when it may."""
    if not NAME.match(name):
        return (
            f"{name!r} is not a variable name: letters, digits and '_', not starting with a digit"
        )
    upper = name.upper()
    if upper.startswith("LLMGW_"):
        return f"{name} is the agent's own setting, not the engine's; leave it out"
    if upper in RESERVED or upper.startswith(RESERVED_PREFIXES[1:]):
        return (
            f"{name} is set by llmgw or changes which code the engine loads; "
            "llmgw sets the cards, keys, hub and libraries itself: leave it out"
        )
    rules = RULES.get(engine)
    if rules is not None and upper in rules.refused_env:
        return f"{name} names a file, an address or the key of {engine}; leave it out"
    if len(value) > MAX_VALUE or any(c in value for c in "\n\r\0"):
        return f"{name}: a value is one line of at most {MAX_VALUE} characters"
    path = _outside(value)
    if path is not None:
        return (
            f"{name}={value} names a path outside the replica's directory ({path}); "
            "give a path relative to it, or none"
        )
    return None


def _outside(value: str) -> str | None:
    """The part of ``value`` that names a path outside the replica's directory."""
    for part in re.split(r"[:,;= ]", value) if not value.startswith("file:") else [value]:
        if part.startswith(("/", "~", "file:")):
            return part
        if ".." in part.replace("\\", "/").split("/"):
            return part
    return None


def check_env(engine: str, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as kept, or EnvError naming the first variable refused."""
    if len(env) > MAX_VARIABLES:
        raise EnvError(f"at most {MAX_VARIABLES} variables, not {len(env)}")
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise EnvError(f"{name!r}: names and values are text")
        why = refusal(engine, name, value)
        if why is not None:
            raise EnvError(why)
    return dict(env)
