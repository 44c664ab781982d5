"""The catalog's and the gateway's pages: models, a model's card, keys and the audit log.

Reads and changes are in-process over the services the admin API calls too: the
catalog (``ModelService`` and its views), the planner, and the gateway's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.catalog.model import Model
from llmgw.server.gateway.keyservice import key_json
from llmgw.server.pages import orgpages
from llmgw.server.pages.frame import Frame, Page, PageCall, PageHandler, Services, form_body
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import (
    CreateKey,
    PlanQuery,
    ReplicasRequest,
    RestartRequest,
    ServeRequest,
)

MODEL_ACTIONS = ("stop", "start", "restart")


def pages(frame: Frame, services: Services) -> list[Page]:
    models, views, keys = services.models, services.views, services.keys

    async def catalog(call: PageCall) -> Response:
        template = "models_body.html" if call.htmx else "models.html"
        return frame.render(call.request, template, call.session, models=views.catalog())

    def find(call: PageCall) -> Model:
        name = str(call.params["name"])
        model = models.models.get(name)
        if model is None:
            raise Refusal(404, "not_found", f"no model {name!r}")
        return model

    async def model(call: PageCall) -> Response:
        found = find(call)
        explained = None if found.external else models.explain(found)
        template = "model_body.html" if call.htmx else "model.html"
        shown = views.model_json(found)
        job = await models.jobs.latest_for(found.name)
        return frame.render(
            call.request, template, call.session, model=shown, explained=explained, job=job
        )

    def changer(action: str) -> PageHandler:
        async def change(call: PageCall) -> Response:
            found = find(call)
            if action == "stop":
                await models.stop(found, call.principal)
            elif action == "start":
                await models.start(found, call.principal)
            else:
                await models.restart(found, schema.read(RestartRequest, {}), call.principal)
            return RedirectResponse(f"/admin/models/{found.name}", status_code=303)

        change.__name__ = f"model_{action}"
        return change

    def keys_context(by: Principal) -> dict[str, Any]:
        return {
            "keys": orgpages.key_rows(services, by),
            "key_owners": orgpages.key_owners(services.people.directory, by),
        }

    async def keys_page(call: PageCall) -> Response:
        template = "keys_table.html" if call.htmx else "keys.html"
        return frame.render(
            call.request, template, call.session, made=None, **keys_context(call.principal)
        )

    async def create_key(call: PageCall) -> Response:
        body = orgpages.key_body(call.form)
        record, key = await keys.create(schema.read(CreateKey, body), call.principal)
        # The key itself is in this one answer and nowhere else: never in a redirect.
        made = {**key_json(record), "key": key}
        return frame.render(
            call.request, "keys.html", call.session, made=made, **keys_context(call.principal)
        )

    async def revoke_key(call: PageCall) -> Response:
        await keys.revoke(str(call.params["key_id"]), call.principal)
        return RedirectResponse("/admin/keys", status_code=303)

    async def audit(call: PageCall) -> Response:
        query = call.request.query_params.get("q", "")[:200]
        rows = await services.store.audit_log(limit=500)
        words = query.lower().split()
        if words:
            rows = [
                r
                for r in rows
                if all(
                    w
                    in " ".join(
                        str(r.get(k, "")) for k in ("actor", "action", "target", "detail")
                    ).lower()
                    for w in words
                )
            ]
        template = "audit_table.html" if call.htmx else "audit.html"
        return frame.render(call.request, template, call.session, rows=rows, q=query)

    def plan_query(form: Mapping[str, str]) -> dict[str, str]:
        """The planner's query from the serve form: only the fields it takes, as given."""
        keys = ("source", "context", "gpus", "engine")
        return {k: form[k].strip() for k in keys if form.get(k, "").strip()}

    async def estimate(call: PageCall) -> Response:
        asked = plan_query(call.request.query_params)
        if "source" not in asked:
            raise Refusal(
                400, "bad_request", "source: say what to serve (a path, hf:ORG/REPO or a URL)"
            )
        planned = await services.planner.plan(schema.read_query(PlanQuery, asked))
        return frame.render(call.request, "plan.html", call.session, plan=planned)

    async def serve(call: PageCall) -> Response:
        body = form_body(
            call.form,
            texts=("name", "engine"),
            numbers=("context", "gpus", "replicas", "max_output"),
        )
        body["source"] = call.form.get("source", "").strip()
        made = await models.serve(schema.read(ServeRequest, body), call.principal)
        return RedirectResponse(f"/admin/models/{made.name}", status_code=303)

    async def scale(call: PageCall) -> Response:
        found = find(call)
        body = form_body(call.form, texts=("profile",), numbers=("replicas",))
        if "replicas" not in body:
            raise Refusal(400, "bad_request", "replicas: say how many (a whole number)")
        ask = schema.read(ReplicasRequest, body)
        await models.set_replicas(models.served(found.name), ask, call.principal)
        return RedirectResponse(f"/admin/models/{found.name}", status_code=303)

    async def remove(call: PageCall) -> Response:
        found = find(call)
        if call.form.get("confirm") != found.name:
            raise Refusal(
                400, "bad_request", f"confirm: type the model's name, {found.name}, to remove it"
            )
        await models.remove(found, call.form.get("with_files") == "on", call.principal)
        return RedirectResponse("/admin/models", status_code=303)

    async def replicas(call: PageCall) -> Response:
        rows = views.replicas()
        template = "replicas_body.html" if call.htmx else "replicas.html"
        return frame.render(call.request, template, call.session, rows=rows)

    return [
        Page("GET", "/admin/models", catalog),
        # The planner reads the source (a download's headers, a node's file): an operator's.
        Page("GET", "/admin/models/plan", estimate, role="operator"),
        Page("POST", "/admin/models", serve, role="operator"),
        Page("POST", "/admin/models/{name}/replicas", scale, role="operator"),
        Page("POST", "/admin/models/{name}/remove", remove, role="operator"),
        Page("GET", "/admin/replicas", replicas),
        Page("GET", "/admin/models/{name}", model),
        *(
            Page("POST", f"/admin/models/{{name}}/{a}", changer(a), role="operator")
            for a in MODEL_ACTIONS
        ),
        # Anyone signed in: ``KeyService`` shows each their keys and refuses the rest.
        Page("GET", "/admin/keys", keys_page, role="member"),
        Page("POST", "/admin/keys", create_key, role="member"),
        Page("POST", "/admin/keys/{key_id}/revoke", revoke_key, role="member"),
        Page("GET", "/admin/audit", audit),
    ]
