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
from llmgw.server.gateway.grants import grant_rows
from llmgw.server.ldap.service import (
    DEACTIVATED_CODE,
    FIRST_ON_LEADER_CODE,
    OFF_CODE,
    UNAVAILABLE_CODE,
    WRONG_CODE,
)
from llmgw.server.pages import (
    catalogpages,
    devicepages,
    explorepages,
    fabricpages,
    finetunepages,
    fleetpages,
    guardpages,
    i18n,
    mcppages,
    mirrorpages,
    oidcpages,
    orgpages,
    peoplepages,
    playpages,
    signinpages,
    slurmpages,
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
from llmgw.wire.admin import McpGrantJson


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
    oidc = services.oidc

    async def login_page(
        request: Request, status: int = 200, error: str | None = None, back: str = "/admin"
    ) -> Response:
        """The sign-in page: the admin token's form, a "Sign in with ..." button while
        OIDC is set, and a login and password's while LDAP sign-in is set."""
        ldap = services.ldap is not None and await services.ldap.enabled()
        button = oidc.button if oidc is not None else None
        answer = frame.render(
            request,
            "login.html",
            None,
            status=status,
            error=error,
            next=back,
            ldap=ldap,
            oidc=button,
        )
        return secured(answer)

    def signed_in(request: Request, cookie: str, back: str) -> Response:
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
        return secured(redirect)

    async def sign_in_form(request: Request) -> Response:
        if gate.session(request) is not None:
            return RedirectResponse(safe_next(request.query_params.get("next")), status_code=303)
        return await login_page(request, back=safe_next(request.query_params.get("next")))

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
            return await login_page(request, exc.status, exc.message)
        back = safe_next(form.get("next"))
        wait = limiter.wait(address)
        if wait > 0:
            text = _(
                "Too many failed sign-ins from your address; try again in {seconds} s.",
                seconds=int(wait) + 1,
            )
            answer = await login_page(request, 429, text, back)
            answer.headers["Retry-After"] = str(int(wait) + 1)
            return answer
        if "login" in form:
            return await ldap_sign_in(request, form, back, address)
        token = form.get("token", "").strip()
        if not token or not services.admin_token_ok(token):
            limiter.failed(address)
            text = _("That token is not an admin token of this cluster.")
            return await login_page(request, 401, text, back)
        limiter.succeeded(address)
        cookie = sessions.open(f"admin@{address}", "admin", pki.token_hash(token))
        await services.store.audit(f"admin@{address}", "admin.sign_in", "/admin")
        return signed_in(request, cookie, back)

    async def ldap_sign_in(
        request: Request, form: Mapping[str, str], back: str, address: str
    ) -> Response:
        """A login and password, checked against the directory by ``LdapService``."""
        _ = i18n.translator(frame.lang(request))
        said = {
            WRONG_CODE: _("Wrong login or password."),
            DEACTIVATED_CODE: _("This account is deactivated; ask an admin."),
            UNAVAILABLE_CODE: _("The directory cannot be asked now; try again later."),
            OFF_CODE: _("Signing in with a login and password is off."),
            FIRST_ON_LEADER_CODE: _(
                "This control plane is a standby: sign in on the leader once, to make your account."
            ),
        }
        if services.ldap is None:
            return await login_page(request, 404, said[OFF_CODE], back)
        try:
            person = await services.ldap.sign_in(form.get("login", ""), form.get("password", ""))
        except Refusal as exc:
            # A wrong guess counts; a directory that does not answer is no one's guess.
            if exc.code == WRONG_CODE:
                limiter.failed(address)
            return await login_page(request, exc.status, said.get(exc.code, exc.message), back)
        limiter.succeeded(address)
        return signed_in(request, sessions.open_person(person.login, person.id), back)

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

    def grants(server: str) -> list[McpGrantJson]:
        return grant_rows(services.orgs.directory.now, services.gateway.keys.records(), server)

    pages: list[Page] = [
        *fleetpages.pages(
            frame,
            services,
            lambda: gateway_totals(services.gateway),
            lambda: services.gateway.metrics.recent.series(time.time()),
            slurmpages.of_node(services.slurm),
        ),
        *catalogpages.pages(frame, services),
        *usagepages.pages(frame, services),
        *peoplepages.pages(frame, services),
        *orgpages.pages(frame, services),
        *(signinpages.pages(frame, services.signins) if services.signins else []),
        *playpages.pages(frame),
        *fabricpages.pages(frame, services.fabrics, services.registry),
        *devicepages.pages(frame, services.device_logins),
        *(slurmpages.pages(frame, services.slurm) if services.slurm else []),
        *mirrorpages.pages(frame, services.mirror, services.mirror_watch),
        *(mcppages.pages(frame, services.mcp, grants) if services.mcp else []),
        *(guardpages.pages(frame, services.guard) if services.guard else []),
        *(explorepages.pages(frame, services.explore) if services.explore else []),
        *(finetunepages.pages(frame, services.finetunes) if services.finetunes else []),
    ]
    out: list[BaseRoute] = [
        Route("/admin/login", sign_in_form, methods=["GET"]),
        Route("/admin/login", sign_in, methods=["POST"]),
        *(oidcpages.routes(frame, oidc, services.store, login_page) if oidc else []),
        Route("/admin/logout", sign_out, methods=["POST"]),
        Route("/admin/lang/{lang}", language, methods=["GET"]),
        Route("/admin/static/{name}", static, methods=["GET"]),
    ]
    out += [Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages]
    # Last: any other path under /admin is a page that does not exist, with the headers.
    out.append(Route("/admin/{rest:path}", not_found, methods=["GET", "POST"]))
    return out
