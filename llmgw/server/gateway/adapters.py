"""LoRA adapters at the gateway: what a request's ``model`` names, and the body each
replica's engine is sent for it.

A request names an adapter as ``MODEL:ADAPTER`` or by the adapter's own name (one
namespace with the models, ``catalog/adapters.py``). Either goes to the base model's
replicas that loaded the adapter (``Router.serving``), under the adapter's own name:
that name is what a key's allowlist must allow (allowing the model is not enough), and
what the usage, the request metrics, the queue and the router count it under. An
on-demand model is started for its adapters' requests as for its own.

Each engine is told in its own words, per replica (a retry on another replica is told
again):

- llama.cpp loads every adapter unapplied (``--lora FILE ... --lora-init-without-apply``);
  a request applies one with ``"lora": [{"id": INDEX, "scale": S}]``, INDEX the
  adapter's place in that replica's own ``--lora`` order as its agent reported it, and
  ``model`` is the base model's name.
- vLLM serves each adapter under its name (``--lora-modules NAME=PATH``): ``model`` is
  the adapter's name.

A client's own ``lora`` field is refused: adapters are asked for by name, so that no
index can reach one a key is not allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.jsonvalue import JSONObject
from llmgw.server.catalog.adapters import SEPARATOR
from llmgw.server.catalog.model import Adapter, Model
from llmgw.server.gateway.checks import Rejected
from llmgw.server.gateway.router import Catalog, Endpoint

# The per-request field llama.cpp's server reads the adapters to apply from.
LORA_FIELD = "lora"


@dataclass(frozen=True)
class Asked:
    """An adapter a request names: the model whose replicas serve it, and itself."""

    model: Model
    adapter: Adapter

    @property
    def name(self) -> str:
        return self.adapter.name

    def body_for(self, endpoint: Endpoint, raw: bytes) -> bytes:
        """The request as ``endpoint``'s engine must read it to apply the adapter. The
        router sends it only to replicas that loaded the adapter; any other would answer
        as the base model, so it is a LookupError, never a silent base answer."""
        loaded = endpoint.adapters or ()
        if self.name not in loaded:
            raise LookupError(f"{endpoint.replica_id} did not load adapter {self.name}")
        body = json.loads(raw)
        if endpoint.engine == "llama.cpp":
            body[LORA_FIELD] = [{"id": loaded.index(self.name), "scale": self.adapter.scale}]
            body["model"] = self.model.name
        else:
            body["model"] = self.name
        return json.dumps(body).encode()


class AdapterBook:
    """The adapters a request's ``model`` can name, read again only when the catalog
    changes."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._version = -1
        self._named: dict[str, Asked] = {}
        self._own: list[Asked] = []

    def _read(self) -> None:
        if self.catalog.version == self._version:
            return
        named: dict[str, Asked] = {}
        own: list[Asked] = []
        for model in self.catalog.models.values():
            for adapter in model.adapters:
                asked = Asked(model, adapter)
                own.append(asked)
                named[adapter.name] = asked
                named[f"{model.name}{SEPARATOR}{adapter.name}"] = asked
        self._named, self._own = named, sorted(own, key=lambda a: a.name)
        self._version = self.catalog.version

    def find(self, name: str) -> Asked | None:
        """The adapter ``name`` names (``MODEL:ADAPTER`` or its own name); None else."""
        self._read()
        return self._named.get(name)

    def base(self, name: str) -> str:
        """The model that serves ``name``: an adapter's model, else ``name`` itself."""
        asked = self.find(name)
        return asked.model.name if asked is not None else name

    def sharing(self, name: str) -> list[str]:
        """Every name served by the replicas ``name`` is: its model's and its adapters'."""
        model = self.catalog.models.get(self.base(name))
        if model is None:
            return [name]
        return [model.name, *(a.name for a in model.adapters)]

    def released_to(self, released: Callable[[str], None]) -> Callable[[str], None]:
        """``released`` (the queue's: a request of a name ended) told every name that
        shares its replicas, since the slot it freed is theirs as much."""

        def each(name: str) -> None:
            for shared in self.sharing(name):
                released(shared)

        return each

    def demand_of(self, demand: Callable[[str, bool], None]) -> Callable[[str, bool], None]:
        """``demand`` (the catalog's: keep a model up, start it) told the model an
        adapter's name belongs to."""
        return lambda name, start: demand(self.base(name), start)

    def listing(self, may_use: Callable[[str], bool]) -> list[JSONObject]:
        """``/v1/models``' entries for the adapters a key may use, by name: each its own
        id, its model as ``parent`` and ``root``."""
        self._read()
        return [
            {
                "id": a.name,
                "object": "model",
                "created": 0,
                "owned_by": "llmgw",
                "parent": a.model.name,
                "root": a.model.name,
            }
            for a in self._own
            if may_use(a.name)
        ]


def refuse_client_lora(body: JSONObject) -> None:
    """A client may not pick adapters by index: ``Rejected`` naming the way it may."""
    if LORA_FIELD in body:
        raise Rejected(
            f"'{LORA_FIELD}' is the gateway's to set: ask for an adapter by name in "
            f"'model' (MODEL{SEPARATOR}ADAPTER, or the adapter's own name; see /v1/models)",
            "invalid_request",
            LORA_FIELD,
        )
