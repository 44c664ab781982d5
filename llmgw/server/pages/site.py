"""The admin pages as Starlette routes: sign-in and out, the language switch, the
static files, and every page of ``fleetpages``, ``catalogpages``, ``fabricpages`` and the
rest behind ``Frame``.

Built over the same services as the admin API (``Services``), in the same process and
app: a page never calls the API, over HTTP or in-process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from llmgw import pki
from llmgw.server.access import Gate
from llmgw.server.gateway import Gateway
from llmgw.server.pages import (
    catalogpages,
    fabricpages,
    fleetpages,
    i18n,
    orgpages,
    peoplepages,
    playpages,
    usagepages,
)
from llmgw.server.pages.frame import (
    Frame,
    Page,
    Services,
    read_form,
    safe_next,
    secured,
)
from llmgw.server.refusal import Refusal
from llmgw.server.sessions import COOKIE, CSRF_FIELD, SignInLimiter


def gateway_totals(gateway: Gateway) -> fleetpages.GatewayTotals:
    """Requests, errors and mean time to first token since this control plane started."""
    metrics = gateway.metrics
    requests = sum(metrics.requests.values())
    errors = sum(metrics.errors.values())
    count = sum(h.n for h in metrics.first_byte.values())
    total = sum(h.total for h in metrics.first_byte.values())
    return {"requests": requests, "errors": errors, "ttft": total / count if count else None}


def routes(
    services: Services, gate: Gate, standby: Callable[[], Mapping[str, object] | None]
) -> list[BaseRoute]:
    frame = Frame(gate, standby, services.body_timeout, services.behind_tls)
    sessions = frame.sessions
    limiter = SignInLimiter()

    async def sign_in_form(request: Request) -> Response:
        if gate.session(request) is not None:
            return RedirectResponse(safe_next(request.query_params.get("next")), status_code=303)
        answer = frame.render(
            request,
            "login.html",
            None,
            error=None,
            next=safe_next(request.query_params.get("next")),
        )
        return secured(answer)

    async def sign_in(request: Request) -> Response:
        _ = i18n.translator(frame.lang(request))
        address = request.client.host if request.client else "?"
        # Another site's page posting here (login CSRF) could only spend this address's
        # tries and lock its admins out: refused, and not counted.
        foreign = frame.refuse_foreign(request, None)
        if foreign is not None:
            return secured(foreign)
        try:
            form = await read_form(request, frame.body_timeout)
        except Refusal as exc:
            return secured(
                frame.render(
                    request, "login.html", None, status=exc.status, error=exc.message, next="/admin"
                )
            )
        back = safe_next(form.get("next"))
        wait = limiter.wait(address)
        if wait > 0:
            text = _(
                "Too many failed sign-ins from your address; try again in {seconds} s.",
                seconds=int(wait) + 1,
            )
            answer = frame.render(request, "login.html", None, status=429, error=text, next=back)
            answer.headers["Retry-After"] = str(int(wait) + 1)
            return secured(answer)
        token = form.get("token", "").strip()
        if not token or not services.admin_token_ok(token):
            limiter.failed(address)
            text = _("That token is not an admin token of this cluster.")
            return secured(
                frame.render(request, "login.html", None, status=401, error=text, next=back)
            )
        limiter.succeeded(address)
        cookie = sessions.open(f"admin@{address}", "admin", pki.token_hash(token))
        redirect = RedirectResponse(back, status_code=303)
        redirect.set_cookie(
            COOKIE,
            cookie,
            max_age=int(sessions.ttl),
            path="/admin",
            httponly=True,
            samesite="strict",
            secure=services.behind_tls or request.url.scheme == "https",
        )
        await services.store.audit(f"admin@{address}", "admin.sign_in", "/admin")
        return secured(redirect)

    async def sign_out(request: Request) -> Response:
        session = gate.session(request)
        answer = RedirectResponse("/admin/login", status_code=303)
        if session is not None:
            foreign = frame.refuse_foreign(request, session)
            if foreign is not None:
                return secured(foreign)
            try:
                form = await read_form(request, frame.body_timeout)
            except Refusal as exc:
                return secured(frame.refuse(request, session, exc.status, exc.message))
            if not sessions.csrf_ok(session, form.get(CSRF_FIELD)):
                _ = i18n.translator(frame.lang(request))
                text = _("The form token is missing or old; reload the page and send it again.")
                return secured(frame.refuse(request, session, 403, text))
            await services.revocations.end(session, session.actor)
        answer.delete_cookie(COOKIE, path="/admin", httponly=True, samesite="strict")
        return secured(answer)

    async def language(request: Request) -> Response:
        lang = str(request.path_params["lang"])
        back = safe_next(request.query_params.get("next"))
        answer = RedirectResponse(back, status_code=303)
        if lang in i18n.LANGUAGES:
            answer.set_cookie(
                i18n.LANG_COOKIE, lang, max_age=365 * 86400, path="/admin", samesite="strict"
            )
        return secured(answer)

    async def static(request: Request) -> Response:
        return secured(frame.assets.answer(str(request.path_params["name"])))

    async def not_found(request: Request) -> Response:
        _ = i18n.translator(frame.lang(request))
        return secured(frame.refuse(request, gate.session(request), 404, _("Not found")))

    pages: list[Page] = [
        *fleetpages.pages(
            frame,
            services,
            lambda: gateway_totals(services.gateway),
            lambda: services.gateway.metrics.recent.series(time.time()),
        ),
        *catalogpages.pages(frame, services),
        *usagepages.pages(frame, services),
        *peoplepages.pages(frame, services),
        *orgpages.pages(frame, services),
        *playpages.pages(frame),
        *fabricpages.pages(frame, services.fabrics, services.registry),
    ]
    out: list[BaseRoute] = [
        Route("/admin/login", sign_in_form, methods=["GET"]),
        Route("/admin/login", sign_in, methods=["POST"]),
        Route("/admin/logout", sign_out, methods=["POST"]),
        Route("/admin/lang/{lang}", language, methods=["GET"]),
        Route("/admin/static/{name}", static, methods=["GET"]),
    ]
    out += [Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages]
    # Last: any other path under /admin is a page that does not exist, with the headers.
    out.append(Route("/admin/{rest:path}", not_found, methods=["GET", "POST"]))
    return out
