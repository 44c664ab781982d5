"""Multimodal projectors: which ``mmproj-*.gguf`` goes with a GGUF model, and whether a
safetensors model takes images.

A GGUF vision model is two files: the language model and its projector (llama.cpp's
``--mmproj``), published side by side in one repository (``mmproj-F16.gguf``,
``mmproj-model-f32.gguf``). Shared by both roles: the hub selection fetches the
projector with the model (``hub.select_files``), the agent finds it on disk for a local
source or in the cache, and both choose the same way:

1. one projector: that one;
2. several: the one carrying the model file's own precision as a word (a ``Q8_0``
   model with ``mmproj-Q8_0.gguf``), where the model is given at one of the precisions
   projectors are published in;
3. else the F16 one;
4. else the first by path.

Projectors in the model file's own folder are preferred to those elsewhere in the
repository. Nothing here does IO but ``takes_images_config``'s caller reading a file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

# The precisions projectors are published in, most specific first (BF16 before F16).
_PRECISIONS = ("BF16", "F16", "F32", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0")
PREFERRED = "F16"
# The transformers architectures vLLM and SGLang serve with an image input; a model
# whose config.json has a ``vision_config`` takes images too.
_VISION_ARCHITECTURES = re.compile(
    r"VL|Vision|Llava|LLaVA|Mllama|Idefics|Pixtral|Gemma3ForConditional|InternVL|MiniCPMV"
)


def is_projector(path: str) -> bool:
    """A multimodal projector: a ``.gguf`` whose name begins ``mmproj``."""
    name = PurePosixPath(path).name.lower()
    return name.startswith("mmproj") and name.endswith(".gguf")


def _word(precision: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(precision)}(?![A-Za-z0-9_])", re.IGNORECASE)


def precision_of(path: str) -> str | None:
    """The precision a GGUF file's name carries among those projectors come in."""
    name = PurePosixPath(path).name
    return next((p for p in _PRECISIONS if _word(p).search(name)), None)


def choose_projector(candidates: Sequence[str], model: str) -> str | None:
    """The projector (a path among ``candidates``, which may hold other files) to go with
    the GGUF file ``model``; None when there is none."""
    projectors = sorted(p for p in candidates if is_projector(p) and p != model)
    if not projectors:
        return None
    folder = PurePosixPath(model).parent
    beside = [p for p in projectors if PurePosixPath(p).parent == folder]
    pool = beside or projectors
    if len(pool) == 1:
        return pool[0]
    for precision in (precision_of(model), PREFERRED):
        if precision is None:
            continue
        match = [p for p in pool if _word(precision).search(PurePosixPath(p).name)]
        if match:
            return match[0]
    return pool[0]


def takes_images_config(config: Mapping[str, object]) -> bool:
    """Whether a transformers ``config.json`` describes a model with an image input: a
    ``vision_config``, or an architecture of the families vLLM serves images to."""
    if isinstance(config.get("vision_config"), dict):
        return True
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return False
    return any(isinstance(a, str) and _VISION_ARCHITECTURES.search(a) for a in architectures)
