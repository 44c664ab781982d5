"""The catalog's and the gateway's pages: models, a model's card, keys and the audit log.

Reads are in-process over the catalog service, the gateway's keys and the store; every
change is the admin API's own handler, called through ``Actions``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.responses import RedirectResponse, Response

from llmgw.server.api.keys import key_json
from llmgw.server.gateway import Gateway
from llmgw.server.pages.frame import Actions, Frame, Page, PageCall, form_body
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store

MODEL_ACTIONS = ("stop", "start", "restart")
NAMED = "/api/v1/models/{name}"


def pages(
    frame: Frame,
    actions: Actions,
    models: Callable[[], list[dict[str, Any]]],
    gateway: Gateway,
    store: Store,
) -> list[Page]:
    """``models`` gives the catalog as the API shows it."""

    async def catalog(call: PageCall) -> Response:
        template = "models_body.html" if call.htmx else "models.html"
        return frame.render(call.request, template, call.session, models=models())

    def find(call: PageCall) -> dict[str, Any]:
        name = str(call.params["name"])
        for model in models():
            if model["name"] == name:
                return model
        raise Refusal(404, "not_found", f"no model {name!r}")

    async def model(call: PageCall) -> Response:
        shown = find(call)
        explained = None
        if not shown.get("external"):
            explained = await actions.run(
                call.request, call.actor, "GET", f"{NAMED}/explain", params={"name": shown["name"]}
            )
        template = "model_body.html" if call.htmx else "model.html"
        return frame.render(call.request, template, call.session, model=shown, explained=explained)

    def changer(action: str) -> Callable[[PageCall], Any]:
        async def change(call: PageCall) -> Response:
            shown = find(call)
            await actions.run(
                call.request,
                call.actor,
                "POST",
                f"{NAMED}/{action}",
                params={"name": shown["name"]},
            )
            return RedirectResponse(f"/admin/models/{shown['name']}", status_code=303)

        change.__name__ = f"model_{action}"
        return change

    def key_rows() -> list[dict[str, Any]]:
        month = gateway.keys.usage.month
        return [
            {**key_json(r), "month_tokens": month.get(r.id)}
            for r in sorted(gateway.keys.records(), key=lambda r: -r.created_at)
        ]

    async def keys(call: PageCall) -> Response:
        template = "keys_table.html" if call.htmx else "keys.html"
        return frame.render(call.request, template, call.session, keys=key_rows(), made=None)

    async def create_key(call: PageCall) -> Response:
        form = call.form
        body = form_body(form, texts=("expires",), numbers=("rpm", "tpm", "budget"))
        body["name"] = form.get("name", "")
        body["models"] = [p.strip() for p in form.get("models", "").split(",") if p.strip()]
        made = await actions.run(call.request, call.actor, "POST", "/api/v1/keys", body=body)
        # The key itself is in this one answer and nowhere else: never in a redirect.
        return frame.render(call.request, "keys.html", call.session, keys=key_rows(), made=made)

    async def revoke_key(call: PageCall) -> Response:
        await actions.run(
            call.request,
            call.actor,
            "DELETE",
            "/api/v1/keys/{key_id}",
            params={"key_id": str(call.params["key_id"])},
        )
        return RedirectResponse("/admin/keys", status_code=303)

    async def audit(call: PageCall) -> Response:
        query = call.request.query_params.get("q", "")[:200]
        rows = await store.audit_log(limit=500)
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
        planned = await actions.run(call.request, call.actor, "GET", "/api/v1/plan", query=asked)
        return frame.render(call.request, "plan.html", call.session, plan=planned)

    async def serve(call: PageCall) -> Response:
        body = form_body(
            call.form,
            texts=("name", "engine"),
            numbers=("context", "gpus", "replicas", "max_output"),
        )
        body["source"] = call.form.get("source", "").strip()
        made = await actions.run(call.request, call.actor, "POST", "/api/v1/models", body=body)
        return RedirectResponse(f"/admin/models/{made['name']}", status_code=303)

    async def scale(call: PageCall) -> Response:
        shown = find(call)
        body = form_body(call.form, texts=("profile",), numbers=("replicas",))
        if "replicas" not in body:
            raise Refusal(400, "bad_request", "replicas: say how many (a whole number)")
        await actions.run(
            call.request,
            call.actor,
            "POST",
            f"{NAMED}/replicas",
            params={"name": shown["name"]},
            body=body,
        )
        return RedirectResponse(f"/admin/models/{shown['name']}", status_code=303)

    async def remove(call: PageCall) -> Response:
        shown = find(call)
        if call.form.get("confirm") != shown["name"]:
            raise Refusal(
                400, "bad_request", f"confirm: type the model's name, {shown['name']}, to remove it"
            )
        with_files = "true" if call.form.get("with_files") == "on" else "false"
        await actions.run(
            call.request,
            call.actor,
            "DELETE",
            NAMED,
            params={"name": shown["name"]},
            query={"with_files": with_files},
        )
        return RedirectResponse("/admin/models", status_code=303)

    async def replicas(call: PageCall) -> Response:
        rows = await actions.run(call.request, call.actor, "GET", "/api/v1/replicas")
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
        Page("GET", "/admin/keys", keys),
        Page("POST", "/admin/keys", create_key, role="admin"),
        Page("POST", "/admin/keys/{key_id}/revoke", revoke_key, role="admin"),
        Page("GET", "/admin/audit", audit),
    ]
