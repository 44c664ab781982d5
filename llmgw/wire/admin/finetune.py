"""The admin API's fine-tune jobs (``/api/v1/finetunes``), as the control plane writes
them and ``ctl finetune`` and the pages read them.

No ``from __future__ import annotations``: see ``llmgw.wire.admin``."""

from typing import Literal, TypedDict, get_args

FinetuneState = Literal[
    "queued",
    "preparing",
    "training",
    "converting",
    "uploading",
    "succeeded",
    "failed",
    "cancelled",
]
STATES: tuple[FinetuneState, ...] = get_args(FinetuneState)
ENDED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class FinetuneJson(TypedDict):
    """One fine-tune job. ``loss``: one per logged step, in order; ``step`` and
    ``steps``, ``peak_mib`` (MiB: the card's peak allocation, or the process's peak RSS
    on the CPU) and ``adapter_bytes`` are None until the node says them."""

    id: str
    name: str
    model: str
    node: str | None
    state: FinetuneState
    epochs: int
    rank: int
    mib: int
    pairs: int
    step: int | None
    steps: int | None
    loss: list[float]
    peak_mib: float | None
    error: str | None
    created: float
    updated: float
    adapter_bytes: int | None
    # Beside the decided fields: the weights trained on, the device, what it is doing.
    base: str
    device: str | None
    doing: str | None
