"""The admin pages' sign-in through the cluster's OpenID Connect provider (or Entra ID):
``/admin/login/oidc`` sends the browser to the provider, ``/admin/login/oidc/callback``
takes it back, and the person is signed in with a session cookie of their own
(``Sessions.open_person``), their role read from the directory at every request.

The sign-in's state travels in a sealed cookie (``oidcflow``) sent back with the
provider's redirect, so it is ``SameSite=Lax`` (a top-level GET from another site) and
scoped to ``/admin/login/oidc``. The session cookie is ``SameSite=Strict``, which a
browser does not send along a redirect chain another site began: so the callback
answers a short page that moves on to the pages itself, a navigation of this site.

A refusal answers the login page with its reason in the person's language, and is
logged with its detail (never a code, token or secret).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from llmgw.server.pages import i18n
from llmgw.server.pages.frame import Frame, safe_next, secured, site_origin
from llmgw.server.people.oidcflow import PENDING_COOKIE, OidcFlow, SignInFailed
from llmgw.server.sessions import COOKIE
from llmgw.server.store import Store

log = logging.getLogger("llmgw.signin")

CALLBACK = "/admin/login/oidc/callback"
PENDING_PATH = "/admin/login/oidc"


def routes(
    frame: Frame,
    flow: OidcFlow,
    store: Store,
    login_page: Callable[[Request, int, str | None, str], Awaitable[Response]],
) -> list[BaseRoute]:
    """``login_page(request, status, error, next)``: the login page with an error."""

    def secure(request: Request) -> bool:
        return frame.behind_tls or request.url.scheme == "https"

    async def failed(request: Request, exc: SignInFailed, back: str) -> Response:
        address = request.client.host if request.client else "?"
        log.warning("OIDC sign-in from %s refused: %s", address, exc.detail)
        _ = i18n.translator(frame.lang(request))
        answer = await login_page(request, exc.status, _(exc.message), back)
        answer.delete_cookie(PENDING_COOKIE, path=PENDING_PATH, httponly=True, samesite="lax")
        return secured(answer)

    async def begin(request: Request) -> Response:
        back = safe_next(request.query_params.get("next"))
        redirect_uri = site_origin(request, frame.behind_tls) + CALLBACK
        try:
            url, pending = await flow.begin(redirect_uri, back)
        except SignInFailed as exc:
            return await failed(request, exc, back)
        answer = RedirectResponse(url, status_code=303)
        answer.set_cookie(
            PENDING_COOKIE,
            pending,
            max_age=600,
            path=PENDING_PATH,
            httponly=True,
            samesite="lax",
            secure=secure(request),
        )
        return secured(answer)

    async def callback(request: Request) -> Response:
        address = request.client.host if request.client else "?"
        query = {k: v[:4096] for k, v in request.query_params.items()}
        try:
            person, back = await flow.finish(
                query, request.cookies.get(PENDING_COOKIE), f"oidc@{address}"
            )
        except SignInFailed as exc:
            return await failed(request, exc, "/admin")
        cookie = frame.sessions.open_person(person.login, person.id)
        log.info("%s signed in through OIDC from %s", person.login, address)
        await store.audit(person.login, "admin.sign_in", "/admin", "oidc")
        answer = frame.render(request, "signed_in.html", None, next=back, login=person.login)
        answer.set_cookie(
            COOKIE,
            cookie,
            max_age=int(frame.sessions.ttl),
            path="/admin",
            httponly=True,
            samesite="strict",
            secure=secure(request),
        )
        answer.delete_cookie(PENDING_COOKIE, path=PENDING_PATH, httponly=True, samesite="lax")
        return secured(answer)

    return [
        Route(PENDING_PATH, begin, methods=["GET"]),
        Route(CALLBACK, callback, methods=["GET"]),
    ]
