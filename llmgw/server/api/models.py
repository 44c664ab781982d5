"""``/api/v1/models``: the catalog's routes over ``ModelService``, and the marks of
nodes (cordon, drain, labels) over ``FleetService``."""

from __future__ import annotations

from llmgw.server.api.replicas import node_json
from llmgw.server.api.routing import Call, Empty, Op, Ops
from llmgw.server.catalog.service import ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet.service import MARKS, FleetService, Mark
from llmgw.server.requests import (
    ContextRequest,
    ExternalRequest,
    GpusRequest,
    LabelsRequest,
    RemoveQuery,
    ReplicasRequest,
    RestartRequest,
    ServeRequest,
)
from llmgw.wire.admin import DemandJson, ModelJson, ModelRemovedJson, NodeJson

MODEL = {"type": "object", "required": ["name", "state", "profiles"]}
MODELS = {"type": "array", "items": MODEL}
NODE = {"type": "object", "required": ["id", "state"]}


def routes(service: ModelService, views: ModelViews, fleet: FleetService) -> Ops:
    async def list_models(call: Call[None, None]) -> list[ModelJson]:
        return views.catalog()

    async def serve(call: Call[ServeRequest, None]) -> ModelJson:
        model, job = await service.serve_job(call.body, call.principal)
        return {**views.model_json(model), "job": job}

    async def external(call: Call[ExternalRequest, None]) -> ModelJson:
        return views.model_json(await service.add_external(call.body, call.principal))

    async def show(call: Call[None, None]) -> ModelJson:
        return views.model_json(service.find(call.params["name"]))

    async def remove(call: Call[None, RemoveQuery]) -> ModelRemovedJson:
        model = service.find(call.params["name"])
        with_files = call.query.with_files
        await service.remove(model, with_files, call.principal)
        return {"name": model.name, "removed": True, "with_files": with_files}

    async def stop(call: Call[Empty, None]) -> ModelJson:
        model = service.find(call.params["name"])
        return views.model_json(await service.stop(model, call.principal))

    async def start(call: Call[Empty, None]) -> ModelJson:
        model = service.find(call.params["name"])
        return views.model_json(await service.start(model, call.principal))

    async def restart(call: Call[RestartRequest, None]) -> ModelJson:
        model = service.find(call.params["name"])
        return views.model_json(await service.restart(model, call.body, call.principal))

    async def context(call: Call[ContextRequest, None]) -> ModelJson:
        model = service.find(call.params["name"])
        return views.model_json(await service.set_context(model, call.body, call.principal))

    async def gpus(call: Call[GpusRequest, None]) -> ModelJson:
        model = service.served(call.params["name"])
        return views.model_json(await service.set_gpus(model, call.body, call.principal))

    async def replicas(call: Call[ReplicasRequest, None]) -> ModelJson:
        model = service.served(call.params["name"])
        return views.model_json(await service.set_replicas(model, call.body, call.principal))

    async def explain(call: Call[None, None]) -> object:
        return service.explain(service.find(call.params["name"]))

    async def demand(call: Call[Empty, None]) -> DemandJson:
        model = service.find(call.params["name"])
        service.demand(model.name, True)
        return {"name": model.name, "on_demand": model.on_demand}

    def marking(action: Mark) -> Op[Empty, None]:
        async def mark(call: Call[Empty, None]) -> NodeJson:
            view = await fleet.mark(call.params["node_id"], action, call.principal)
            return node_json(view)

        mark.__name__ = action
        return Op(
            "POST",
            f"/api/v1/nodes/{{node_id}}/{action}",
            mark,
            f"{action.capitalize()} a node",
            body=Empty,
            body_optional=True,
            answer=NODE,
            errors=(404,),
        )

    async def labels(call: Call[LabelsRequest, None]) -> NodeJson:
        view = await fleet.mark(call.params["node_id"], "labels", call.principal, call.body)
        return node_json(view)

    named = "/api/v1/models/{name}"
    change_errors = (404, 409)
    return [
        Op("GET", "/api/v1/models", list_models, "Every model in the catalog", answer=MODELS),
        Op(
            "POST",
            "/api/v1/models",
            serve,
            "Serve a model",
            body=ServeRequest,
            status=201,
            answer=MODEL,
            errors=(409,),
        ),
        Op(
            "POST",
            "/api/v1/models/external",
            external,
            "Add an OpenAI-compatible provider as a model",
            body=ExternalRequest,
            status=201,
            answer=MODEL,
            errors=(409,),
        ),
        Op("GET", named, show, "One model", answer=MODEL, errors=(404,)),
        Op(
            "DELETE",
            named,
            remove,
            "Remove a model; its replicas stop",
            query=RemoveQuery,
            errors=(404,),
        ),
        Op(
            "POST",
            f"{named}/stop",
            stop,
            "Stop every replica",
            body=Empty,
            body_optional=True,
            answer=MODEL,
            errors=change_errors,
        ),
        Op(
            "POST",
            f"{named}/start",
            start,
            "Start again (un-parks, forgets failures)",
            body=Empty,
            body_optional=True,
            answer=MODEL,
            errors=change_errors,
        ),
        Op(
            "POST",
            f"{named}/restart",
            restart,
            "Replace every replica, one by one",
            body=RestartRequest,
            body_optional=True,
            answer=MODEL,
            errors=change_errors,
        ),
        Op(
            "POST",
            f"{named}/context",
            context,
            "Change context, slots or the longest answer",
            body=ContextRequest,
            answer=MODEL,
            errors=change_errors,
        ),
        Op(
            "POST",
            f"{named}/gpus",
            gpus,
            "Cards per replica of a profile",
            body=GpusRequest,
            answer=MODEL,
            errors=change_errors,
        ),
        Op(
            "POST",
            f"{named}/replicas",
            replicas,
            "Replicas of a profile",
            body=ReplicasRequest,
            answer=MODEL,
            errors=change_errors,
        ),
        Op(
            "GET",
            f"{named}/explain",
            explain,
            "Every node's verdict for each profile",
            answer={"type": "array", "items": {"type": "object"}},
            errors=(404,),
        ),
        Op(
            "POST",
            f"{named}/demand",
            demand,
            "An on-demand model is wanted now",
            body=Empty,
            body_optional=True,
            errors=(404,),
        ),
        *(marking(action) for action in MARKS if action != "labels"),
        Op(
            "POST",
            "/api/v1/nodes/{node_id}/labels",
            labels,
            "Labels a node",
            body=LabelsRequest,
            answer=NODE,
            errors=(404,),
        ),
    ]
