"""``/api/v1/models/{name}/adapters``: a model's LoRA adapters, listed, added, removed.

Each answers the model's adapters as a list of plain fields (name, source, scale) in the
order its replicas load them. Adding or removing one changes every replica's
fingerprint, so the replicas are replaced one by one as for any other change.
"""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.catalog.adapters import adapters_json
from llmgw.server.catalog.service import ModelService
from llmgw.server.requests import AdapterRequest

ADAPTER = {"type": "object", "required": ["name", "source", "scale"]}
ADAPTERS = {"type": "array", "items": ADAPTER}


def routes(service: ModelService) -> Ops:
    async def list_adapters(call: Call[None, None]) -> object:
        return adapters_json(service.find(call.params["name"]))

    async def add(call: Call[AdapterRequest, None]) -> object:
        model = service.served(call.params["name"])
        return adapters_json(await service.add_adapter(model, call.body, call.principal))

    async def remove(call: Call[None, None]) -> object:
        model = service.served(call.params["name"])
        name = call.params["adapter"]
        return adapters_json(await service.remove_adapter(model, name, call.principal))

    path = "/api/v1/models/{name}/adapters"
    return [
        Op("GET", path, list_adapters, "A model's LoRA adapters", answer=ADAPTERS, errors=(404,)),
        Op(
            "POST",
            path,
            add,
            "Add a LoRA adapter; the replicas are replaced with it, one by one",
            body=AdapterRequest,
            status=201,
            answer=ADAPTERS,
            errors=(404, 409),
        ),
        Op(
            "DELETE",
            f"{path}/{{adapter}}",
            remove,
            "Remove a LoRA adapter; the replicas are replaced without it",
            answer=ADAPTERS,
            errors=(404, 409),
        ),
    ]
