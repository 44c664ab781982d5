"""A fine-tune job as the control plane keeps it, its JSON, and its stored form.

The job is one record (``FinetuneJob``) changed by the service as the node reports,
written to the store's ``finetunes`` table as one JSON document beside the columns
that find it (id, name, model, state). Its states, in order: queued (kept, not yet
sent), preparing (the node fetches the base and makes the trainer's environment),
training, converting (to GGUF), uploading (the control plane takes the result in
pieces), then one of succeeded, failed, cancelled.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from llmgw.wire.admin.finetune import ENDED, FinetuneJson, FinetuneState

# One LoRA is r x (d_in + d_out) per adapted matrix: a small rank learns enough for a
# style or a format; 16 is peft's examples' default, 8 its own.
DEFAULT_RANK = 16
DEFAULT_EPOCHS = 3
DEFAULT_MIB = 8000


def new_id() -> str:
    return "ft-" + secrets.token_hex(6)


@dataclass(frozen=True)
class FinetuneJob:
    id: str
    name: str
    model: str
    base: str
    epochs: int
    rank: int
    mib: int
    pairs: int
    created: float
    updated: float
    state: FinetuneState = "queued"
    node: str | None = None
    device: str | None = None
    cards: tuple[str, ...] = ()
    step: int | None = None
    steps: int | None = None
    loss: tuple[float, ...] = field(default_factory=tuple)
    peak_mib: float | None = None
    error: str | None = None
    doing: str | None = None
    adapter_bytes: int | None = None
    adapter_sha256: str | None = None
    adapter_kind: str | None = None
    # Who asked (for the audit entries of what follows).
    by: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def to_json(self) -> FinetuneJson:
        return {
            "id": self.id,
            "name": self.name,
            "model": self.model,
            "node": self.node,
            "state": self.state,
            "epochs": self.epochs,
            "rank": self.rank,
            "mib": self.mib,
            "pairs": self.pairs,
            "step": self.step,
            "steps": self.steps,
            "loss": list(self.loss),
            "peak_mib": self.peak_mib,
            "error": self.error,
            "created": self.created,
            "updated": self.updated,
            "adapter_bytes": self.adapter_bytes,
            "base": self.base,
            "device": self.device,
            "doing": self.doing,
        }

    def document(self) -> str:
        """The stored form: every field, as JSON."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_document(cls, text: str) -> FinetuneJob:
        data = cast(dict[str, Any], json.loads(text))
        data["cards"] = tuple(data.get("cards") or ())
        data["loss"] = tuple(float(x) for x in data.get("loss") or ())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def changed(self, at: float, **fields: Any) -> FinetuneJob:
        return replace(self, updated=at, **fields)
