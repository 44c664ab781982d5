"""SCIM 2.0 at ``/scim/v2`` (RFC 7644), and its settings at ``/api/v1/auth/scim``.

``/scim/v2`` is its own small app, mounted beside the admin API: the admin API's gate
knows it as ``public`` and lets every request through, and every SCIM request is checked
here against SCIM's own bearer token (``ctl auth scim token``), which opens nothing
else, as no other token opens it. Its answers are ``application/scim+json``, its errors
SCIM's shape (``schemas``, ``status``, ``scimType``, ``detail``), unknown paths and
methods included. A standby reads; a write there is a 503 naming the leader (a 409
would tell a provider the user exists).

The settings routes are the cluster admin's: the token, shown once; SCIM off; the map
of groups to memberships.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from llmgw.server.api.routing import Call, Op, Ops, read_json
from llmgw.server.refusal import Refusal
from llmgw.server.scim import discovery, documents, views
from llmgw.server.scim.paths import parse_filter
from llmgw.server.scim.service import Page, ScimService
from llmgw.server.scim.settings import ScimMaps
from llmgw.server.store import StoreUnavailable
from llmgw.wire.admin.scim import ScimJson, ScimTokenJson

log = logging.getLogger("llmgw.scim")

PREFIX = "/scim/v2"
MEDIA = "application/scim+json"
# SCIM's error types (RFC 7644 3.12) a Refusal's code may be.
SCIM_TYPES = {
    "invalidFilter",
    "tooMany",
    "uniqueness",
    "mutability",
    "invalidSyntax",
    "invalidPath",
    "noTarget",
    "invalidValue",
    "invalidVers",
    "sensitive",
}
MAX_BODY = 1 << 20
Handler = Callable[[Request], Awaitable[Response]]


def answer(doc: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return JSONResponse(doc, status_code=status, media_type=MEDIA, headers=headers)


def failure(status: int, detail: str, scim_type: str | None = None) -> Response:
    headers = {"www-authenticate": 'Bearer realm="llmgw-scim"'} if status == 401 else None
    return answer(discovery.error(status, detail, scim_type), status, headers)


@dataclass(frozen=True)
class Asked:
    """A list's or a search's parameters."""

    filter: str | None
    page: Page
    attributes: set[str]
    excluded: set[str]


def _int(value: object, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(str(value))
    except ValueError:
        raise Refusal(400, "invalidValue", f"{name}: {value!r} is not a whole number") from None


def _asked(params: Mapping[str, object]) -> Asked:
    low = {k.lower(): v for k, v in params.items()}

    def text(name: str) -> str | None:
        value = low.get(name)
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        return None if value is None else str(value)

    return Asked(
        text("filter"),
        Page(
            max(_int(low.get("startindex"), "startIndex") or 1, 1), _int(low.get("count"), "count")
        ),
        views.names(text("attributes")),
        views.names(text("excludedattributes")),
    )


def scim_app(
    scim: ScimService,
    standby: Callable[[], Mapping[str, object] | None],
    body_timeout: float,
) -> Starlette:
    auth = scim.auth

    def base(request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}{PREFIX}"

    def guarded(handler: Handler, writes: bool = False) -> Handler:
        async def run(request: Request) -> Response:
            header = request.headers.get("authorization", "")
            if header[:7].lower() != "bearer " or not auth.token_ok(header[7:].strip()):
                return failure(401, "SCIM takes the bearer token `llmgw ctl auth scim token` made")
            if writes:
                leader = standby()
                if leader is not None:
                    where = leader.get("api_address") or "unknown"
                    return failure(
                        503,
                        f"this control plane is a standby; send SCIM to the leader at {where}",
                    )
            try:
                return await handler(request)
            except Refusal as exc:
                kind = exc.code if exc.code in SCIM_TYPES else None
                return failure(exc.status, exc.message, kind)
            except StoreUnavailable as exc:
                return failure(503, str(exc))
            except Exception:
                log.exception("SCIM %s %s failed", request.method, request.url.path)
                return failure(500, "the control plane failed to answer; its log says why")

        return run

    async def body(request: Request) -> object:
        return await read_json(request, MAX_BODY, body_timeout)

    # ------------------------------------------------------------- discovery

    async def config(request: Request) -> Response:
        return answer(discovery.service_provider_config(base(request)))

    async def types(request: Request) -> Response:
        found = discovery.resource_types(base(request))
        return answer(discovery.list_response(found, len(found), 1))

    async def one_type(request: Request) -> Response:
        wanted = request.path_params["name"]
        for doc in discovery.resource_types(base(request)):
            if doc["id"] == wanted:
                return answer(doc)
        raise Refusal(404, "not_found", f"no resource type {wanted}; there are User and Group")

    async def schemas(request: Request) -> Response:
        found = discovery.schemas(base(request))
        return answer(discovery.list_response(found, len(found), 1))

    async def one_schema(request: Request) -> Response:
        wanted = request.path_params["urn"]
        for doc in discovery.schemas(base(request)):
            if doc["id"] == wanted:
                return answer(doc)
        raise Refusal(404, "not_found", f"no schema {wanted}")

    # ----------------------------------------------------------------- users

    def user_doc(request: Request, person_id: str, asked: Asked | None = None) -> dict[str, Any]:
        person = scim.user(person_id)
        doc = views.user_json(
            person, scim.external_id(person.id), scim.groups_of(person.id), base(request)
        )
        if asked is None:
            asked = _asked(request.query_params)
        return views.narrowed(doc, asked.attributes, asked.excluded)

    def user_list(request: Request, asked: Asked) -> Response:
        terms = parse_filter(asked.filter) if asked.filter else ()
        found, total = scim.users_listed(terms, asked.page)
        docs = [user_doc(request, p.id, asked) for p in found]
        return answer(discovery.list_response(docs, total, asked.page.start))

    async def users(request: Request) -> Response:
        return user_list(request, _asked(request.query_params))

    async def search_users(request: Request) -> Response:
        found = await body(request)
        return user_list(request, _asked(found if isinstance(found, Mapping) else {}))

    async def user(request: Request) -> Response:
        return answer(user_doc(request, request.path_params["id"]))

    async def create_user(request: Request) -> Response:
        person = await scim.create_user(documents.read_user(await body(request)))
        doc = user_doc(request, person.id)
        return answer(doc, 201, {"location": doc["meta"]["location"]})

    async def replace_user(request: Request) -> Response:
        fields = documents.read_user(await body(request))
        person = await scim.replace_user(request.path_params["id"], fields)
        return answer(user_doc(request, person.id))

    async def patch_user(request: Request) -> Response:
        operations = documents.read_patch(await body(request))
        person = await scim.patch_user(request.path_params["id"], operations)
        return answer(user_doc(request, person.id))

    async def remove_user(request: Request) -> Response:
        await scim.remove_user(request.path_params["id"])
        return Response(status_code=204)

    # ---------------------------------------------------------------- groups

    def group_doc(request: Request, group_id: str, asked: Asked | None = None) -> dict[str, Any]:
        doc = views.group_json(scim.group(group_id), base(request))
        if asked is None:
            asked = _asked(request.query_params)
        return views.narrowed(doc, asked.attributes, asked.excluded)

    def group_list(request: Request, asked: Asked) -> Response:
        terms = parse_filter(asked.filter) if asked.filter else ()
        found, total = scim.groups_listed(terms, asked.page)
        docs = [group_doc(request, g.id, asked) for g in found]
        return answer(discovery.list_response(docs, total, asked.page.start))

    async def groups(request: Request) -> Response:
        return group_list(request, _asked(request.query_params))

    async def search_groups(request: Request) -> Response:
        found = await body(request)
        return group_list(request, _asked(found if isinstance(found, Mapping) else {}))

    async def group(request: Request) -> Response:
        return answer(group_doc(request, request.path_params["id"]))

    async def create_group(request: Request) -> Response:
        made = await scim.create_group(documents.read_group(await body(request)))
        doc = group_doc(request, made.id)
        return answer(doc, 201, {"location": doc["meta"]["location"]})

    async def replace_group(request: Request) -> Response:
        fields = documents.read_group(await body(request))
        written = await scim.replace_group(request.path_params["id"], fields)
        return answer(group_doc(request, written.id))

    async def patch_group(request: Request) -> Response:
        operations = documents.read_patch(await body(request))
        written = await scim.patch_group(request.path_params["id"], operations)
        return answer(group_doc(request, written.id))

    async def remove_group(request: Request) -> Response:
        await scim.remove_group(request.path_params["id"])
        return Response(status_code=204)

    async def search_all(request: Request) -> Response:
        """Users and groups at once (RFC 7644 3.4.3), users first, paged together."""
        found = await body(request)
        asked = _asked(found if isinstance(found, Mapping) else {})
        terms = parse_filter(asked.filter) if asked.filter else ()
        everyone = Page(1, scim.most)
        people, _ = scim.users_listed(terms, everyone)
        teams, _ = scim.groups_listed(terms, everyone)
        docs = [user_doc(request, p.id, asked) for p in people]
        docs += [group_doc(request, g.id, asked) for g in teams]
        start = max(asked.page.start, 1)
        count = scim.most if asked.page.count is None else max(0, min(asked.page.count, scim.most))
        shown = docs[start - 1 : start - 1 + count]
        return answer(discovery.list_response(shown, len(docs), start))

    def route(path: str, handler: Handler, *methods: str, writes: bool = False) -> Route:
        return Route(path, guarded(handler, writes), methods=list(methods))

    routes = [
        route("/ServiceProviderConfig", config, "GET"),
        route("/ResourceTypes", types, "GET"),
        route("/ResourceTypes/{name}", one_type, "GET"),
        route("/Schemas", schemas, "GET"),
        route("/Schemas/{urn}", one_schema, "GET"),
        route("/.search", search_all, "POST"),
        route("/Users", users, "GET"),
        route("/Users", create_user, "POST", writes=True),
        route("/Users/.search", search_users, "POST"),
        route("/Users/{id}", user, "GET"),
        route("/Users/{id}", replace_user, "PUT", writes=True),
        route("/Users/{id}", patch_user, "PATCH", writes=True),
        route("/Users/{id}", remove_user, "DELETE", writes=True),
        route("/Groups", groups, "GET"),
        route("/Groups", create_group, "POST", writes=True),
        route("/Groups/.search", search_groups, "POST"),
        route("/Groups/{id}", group, "GET"),
        route("/Groups/{id}", replace_group, "PUT", writes=True),
        route("/Groups/{id}", patch_group, "PATCH", writes=True),
        route("/Groups/{id}", remove_group, "DELETE", writes=True),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            return failure(405, f"{request.url.path} does not take {request.method}")
        if exc.status_code == 404:
            return failure(404, f"no SCIM endpoint {request.url.path}")
        return failure(exc.status_code, str(exc.detail))

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def mount(
    scim: ScimService,
    standby: Callable[[], Mapping[str, object] | None],
    body_timeout: float,
) -> Mount:
    """``/scim/v2``, for ``build_app``'s routes beside the admin API's."""
    return Mount(PREFIX, app=scim_app(scim, standby, body_timeout))


# ------------------------------------------------------------------ settings


def routes(scim: ScimService) -> Ops:
    auth = scim.auth

    def shown() -> ScimJson:
        return views.settings_json(scim)

    async def show(call: Call[None, None]) -> ScimJson:
        return shown()

    async def new_token(call: Call[None, None]) -> ScimTokenJson:
        return {"token": await auth.new_token(call.principal), "endpoint": PREFIX}

    async def off(call: Call[None, None]) -> ScimJson:
        await auth.off(call.principal)
        return shown()

    async def set_maps(call: Call[ScimMaps, None]) -> ScimJson:
        await scim.set_maps(call.body.maps, call.principal)
        return shown()

    doc = {"type": "object", "required": ["token", "endpoint", "maps"]}
    return [
        Op(
            "GET",
            "/api/v1/auth/scim",
            show,
            "SCIM provisioning: on or off, its maps",
            answer=doc,
            access="admin",
        ),
        Op(
            "POST",
            "/api/v1/auth/scim/token",
            new_token,
            "A new SCIM bearer token, shown once (the one before ends)",
            answer={"type": "object", "required": ["token", "endpoint"]},
            access="admin",
        ),
        Op(
            "DELETE",
            "/api/v1/auth/scim",
            off,
            "SCIM off: its token ends",
            answer=doc,
            access="admin",
        ),
        Op(
            "POST",
            "/api/v1/auth/scim/maps",
            set_maps,
            "Map SCIM's groups to cluster roles and memberships (all maps at once)",
            body=ScimMaps,
            answer=doc,
            access="admin",
        ),
    ]
