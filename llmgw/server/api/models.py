"""``/api/v1/models``: the catalog's routes, and the scheduling of nodes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmgw.server.api.modelviews import ModelViews
from llmgw.server.api.routing import Call, Empty, Op
from llmgw.server.catalog.model import Model
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
        model = service.find(call.params["name"])
        changed = await service.change(
            model, replace(model, stopped=True), call.actor, "model.stop", ""
        )
        return views.model_json(changed)

    async def start(call: Call) -> Any:
        model = service.find(call.params["name"])
        service.reconciler.forget_failures(model.name)
        if model.on_demand:
            service.reconciler.want(model.name)
        changed = await service.change(
            model, replace(model, stopped=False, parked=None), call.actor, "model.start", ""
        )
        return views.model_json(changed)

    async def restart(call: Call) -> Any:
        model = service.find(call.params["name"])
        ask: RestartRequest = call.body
        changed = replace(model, restart=model.restart + 1, in_place=ask.in_place)
        changed = await service.change(
            model, changed, call.actor, "model.restart", "", replace_running=True
        )
        return views.model_json(changed)

    async def context(call: Call) -> Any:
        model = service.find(call.params["name"])
        ask: ContextRequest = call.body
        if ask.context is None and ask.slots is None and ask.max_output is None:
            raise Refusal(400, "bad_request", "give context, slots or max_output")
        changed = replace(
            model,
            context=ask.context or model.context,
            slots=ask.slots or model.slots,
            max_output=ask.max_output if ask.max_output is not None else model.max_output,
            in_place=ask.in_place,
        )
        if changed.max_output is not None and changed.max_output > changed.context:
            if ask.max_output is None:
                changed = replace(changed, max_output=changed.context)
        detail = (
            f"context {changed.context}, slots {changed.slots}, max_output {changed.max_output}"
        )
        changed = await service.change(model, changed, call.actor, "model.context", detail)
        return views.model_json(changed)

    async def gpus(call: Call) -> Any:
        model = served(call.params["name"])
        ask: GpusRequest = call.body
        profile = service.pick_profile(model, ask.profile)
        new = replace(profile, cards=ask.gpus)
        if not profile.memory_set:
            new = replace(new, memory=0)
        changed = replace(
            model,
            profiles=tuple(new if p.name == profile.name else p for p in model.profiles),
            in_place=ask.in_place,
        )
        detail = f"profile {profile.name}: {profile.cards} -> {ask.gpus} card(s)"
        changed = await service.change(model, changed, call.actor, "model.gpus", detail)
        return views.model_json(changed)

    def served(name: str) -> Model:
        """A model llmgw runs itself: an external provider has no replicas or cards."""
        model = service.find(name)
        if model.external:
            raise Refusal(
                400, "invalid", f"{model.name} is an external provider: it has no replicas"
            )
        return model

    async def replicas(call: Call) -> Any:
        model = served(call.params["name"])
        ask: ReplicasRequest = call.body
        profile = service.pick_profile(model, ask.profile, create=True)
        new = replace(profile, replicas=ask.replicas)
        if profile.name in [p.name for p in model.profiles]:
            profiles = tuple(new if p.name == profile.name else p for p in model.profiles)
        else:
            profiles = (*model.profiles, new)
        changed = replace(model, profiles=profiles)
        detail = f"profile {profile.name}: {profile.replicas} -> {ask.replicas}"
        changed = await service.change(model, changed, call.actor, "model.replicas", detail)
        return views.model_json(changed)

    async def explain(call: Call) -> Any:
        return service.explain(service.find(call.params["name"]))

    async def demand(call: Call) -> Any:
        model = service.find(call.params["name"])
        service.demand(model.name, True)
        return {"name": model.name, "on_demand": model.on_demand}

    async def schedule(call: Call) -> Any:
        node_id = call.params["node_id"]
        action = call.request.url.path.rsplit("/", 1)[1]
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
                schedule,
                f"{action.capitalize()} a node",
                body=LabelsRequest if action == "labels" else Empty,
                body_optional=action != "labels",
                answer=NODE,
                errors=(404,),
            )
            for action in ("cordon", "uncordon", "drain", "labels")
        ),
    ]
