"""``/api/v1/models``: the catalog's routes, and the scheduling of nodes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.server.api.modelviews import ModelViews
from llmgw.server.api.routing import Call, Empty, Op
from llmgw.server.catalog.service import ModelService
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
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
from llmgw.server.store import Audit

MODEL = {"type": "object", "required": ["name", "state", "profiles"]}
MODELS = {"type": "array", "items": MODEL}
NODE = {"type": "object", "required": ["id", "state"]}


def routes(service: ModelService, views: ModelViews, nodes: NodeRegistry) -> list[Op]:
    async def list_models(call: Call) -> Any:
        return [views.model_json(m) for _, m in sorted(service.models.items())]

    async def serve(call: Call) -> Any:
        return views.model_json(await service.serve(call.body, call.actor))

    async def external(call: Call) -> Any:
        return views.model_json(await service.add_external(call.body, call.actor))

    async def show(call: Call) -> Any:
        return views.model_json(service.find(call.params["name"]))

    async def remove(call: Call) -> Any:
        model = service.find(call.params["name"])
        with_files = call.query.with_files
        await service.remove(model, with_files, call.actor)
        return {"name": model.name, "removed": True, "with_files": with_files}

    async def stop(call: Call) -> Any:
        return views.model_json(await service.stop(service.find(call.params["name"]), call.actor))

    async def start(call: Call) -> Any:
        model = service.find(call.params["name"])
        return views.model_json(await service.start(model, call.actor))

    async def restart(call: Call) -> Any:
        model = service.find(call.params["name"])
        return views.model_json(await service.restart(model, call.body, call.actor))

    async def context(call: Call) -> Any:
        model = service.find(call.params["name"])
        return views.model_json(await service.set_context(model, call.body, call.actor))

    async def gpus(call: Call) -> Any:
        model = service.served(call.params["name"])
        return views.model_json(await service.set_gpus(model, call.body, call.actor))

    async def replicas(call: Call) -> Any:
        model = service.served(call.params["name"])
        return views.model_json(await service.set_replicas(model, call.body, call.actor))

    async def explain(call: Call) -> Any:
        return service.explain(service.find(call.params["name"]))

    async def demand(call: Call) -> Any:
        model = service.find(call.params["name"])
        service.demand(model.name, True)
        return {"name": model.name, "on_demand": model.on_demand}

    def scheduler(action: str) -> Callable[[Call], Awaitable[Any]]:
        """The handler of one of a node's marks (the pages call it in-process too)."""

        async def schedule(call: Call) -> Any:
            return await mark(call, action)

        return schedule

    async def mark(call: Call, action: str) -> Any:
        node_id = call.params["node_id"]
        view = nodes.nodes.get(node_id)
        if view is None:
            raise Refusal(404, "not_found", f"no node {node_id!r}; see `llmgw ctl nodes`")
        labels = dict(view.labels)
        cordoned, draining = view.cordoned, view.draining
        if action == "cordon":
            cordoned = True
        elif action == "uncordon":
            cordoned, draining = False, False
        elif action == "drain":
            cordoned, draining = True, True
        else:
            ask: LabelsRequest = call.body
            labels.update(ask.set or {})
            for key in ask.remove:
                labels.pop(key, None)
        audit = Audit(call.actor, f"node.{action}", node_id)
        await nodes.set_scheduling(view, cordoned, draining, labels, audit)
        return view.as_json()

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
        *(
            Op(
                "POST",
                f"/api/v1/nodes/{{node_id}}/{action}",
                scheduler(action),
                f"{action.capitalize()} a node",
                body=LabelsRequest if action == "labels" else Empty,
                body_optional=action != "labels",
                answer=NODE,
                errors=(404,),
            )
            for action in ("cordon", "uncordon", "drain", "labels")
        ),
    ]
