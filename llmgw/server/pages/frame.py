"""What every admin page goes through: its session, role and CSRF token, its headers,
its templates and assets.

A ``Page`` names its method, path, handler and the least role it needs; ``endpoint``
wraps each in the same steps, so no page can skip one:

1. read the session (``sessions.py``, through the API's one ``Gate``); none: a GET is
   sent to ``/admin/login?next=...`` (htmx is told with ``HX-Redirect``), anything else
   is sent there too and changes nothing;
2. a role short of the page's: 403, saying which role it needs (``member``: any person
   signed in, whose memberships give what the services let them do; a person with no
   cluster role opens only such pages);
3. a change (any method but GET): sent by this site's own page (``foreign_origin``: its
   ``Origin``, else its ``Sec-Fetch-Site``), and carrying the session's CSRF token in
   the form or the ``X-CSRF-Token`` header, or 403; on a standby, refused with where the
   leader is;
4. run the handler; every answer gets a strict Content-Security-Policy (scripts and
   styles from this origin only, no inline ones), ``X-Frame-Options: DENY``, no
   sniffing, no referrer across origins and no caching.

Pages read and change through the same services as the admin API (``Services``),
called in-process with the signed-in caller as their ``Principal``: the same checks,
audit entries and errors as ``/api/v1``, no HTTP and no handler in between.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from llmgw.offline.mirrorfiles import MirrorFiles
from llmgw.server import schema
from llmgw.server.access import Access, Gate, allowed
from llmgw.server.catalog.explore import ExploreService
from llmgw.server.catalog.planner import Planner
from llmgw.server.catalog.service import ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.finetune.service import FinetuneService
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.service import FleetService
from llmgw.server.gateway import Gateway, KeyService, ServingSwitch
from llmgw.server.guard.service import GuardService
from llmgw.server.ldap.service import LdapService
from llmgw.server.mcp.service import McpService
from llmgw.server.mirror import MirrorWatch
from llmgw.server.pages import i18n
from llmgw.server.people.devicelogin import DeviceLogins
from llmgw.server.people.oidcflow import OidcFlow
from llmgw.server.people.orgs import OrgService
from llmgw.server.people.service import PeopleService
from llmgw.server.people.signins import SignIns
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.sessions import CSRF_FIELD, CSRF_HEADER, Revocations, Session
from llmgw.server.slurm.service import SlurmService
from llmgw.server.store import Store

log = logging.getLogger("llmgw.pages")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
MAX_FORM = 64 * 1024
# Said by several pages (and translated: the templates hold the same words).
STANDBY = "This control plane is a standby: make changes on the leader, {leader}."
STALE_FORM = "The form token is missing or old; reload the page and send it again."
FOREIGN_FORM = (
    "This form was sent by another site's page ({origin}), not by this control plane's "
    "own ({site}); nothing was changed. Open the page at {site} and send it from there."
)
DEFAULT_PORTS = {"http": 80, "https": 443}
STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


class Assets:
    """The static files, each served under a name with its content's hash, cached for
    a year: a new version is a new name."""

    def __init__(self) -> None:
        root = resources.files("llmgw.server.pages") / "static"
        self.files: dict[str, tuple[bytes, str]] = {}
        self.names: dict[str, str] = {}
        for path in _walk(root):
            data = path.read_bytes()
            name = path.name
            stem, dot, ext = name.rpartition(".")
            if not dot or f".{ext}" not in STATIC_TYPES:
                continue  # licences and version lists ship, but are not served
            digest = hashlib.sha256(data).hexdigest()[:12]
            hashed = f"{stem}.{digest}.{ext}"
            self.files[hashed] = (data, STATIC_TYPES[f".{ext}"])
            self.names[name] = hashed

    def url(self, name: str) -> str:
        return f"/admin/static/{self.names[name]}"

    def answer(self, hashed: str) -> Response:
        found = self.files.get(hashed)
        if found is None:
            return Response("no such file\n", status_code=404, media_type="text/plain")
        data, media = found
        headers = {
            "Cache-Control": "public, max-age=31536000, immutable",
            "X-Content-Type-Options": "nosniff",
        }
        return Response(data, media_type=media, headers=headers)


def _walk(root: Traversable) -> list[Traversable]:
    out: list[Traversable] = []
    for entry in root.iterdir():
        if entry.is_dir():
            out += _walk(entry)
        elif entry.is_file():
            out.append(entry)
    return out


@dataclass(frozen=True)
class Services:
    """What the pages read and change, handed in by the control plane: the services the
    admin API calls too."""

    registry: NodeRegistry
    gateway: Gateway
    store: Store
    keys: KeyService
    serving: ServingSwitch
    models: ModelService
    views: ModelViews
    fleet: FleetService
    planner: Planner
    fabrics: FabricService
    # ``llmgw login``'s codes waiting for their person.
    device_logins: DeviceLogins
    people: PeopleService
    orgs: OrgService
    admin_token_ok: Callable[[str], bool]
    # Signing out, on every control plane.
    revocations: Revocations
    # LDAP sign-in (a login and password on the sign-in page while it is set).
    ldap: LdapService | None = None
    # server.yaml's pages_behind_tls: the session cookie is Secure.
    behind_tls: bool = False
    body_timeout: float = 30.0
    # Sign-in through the cluster's OpenID Connect provider; None: not offered.
    oidc: OidcFlow | None = None
    # The Sign-in page's three ways in (OIDC, LDAP, SCIM); None: no Sign-in page.
    signins: SignIns | None = None
    # Slurm beside llmgw (the Slurm page, a node's Slurm part); None: no Slurm page.
    slurm: SlurmService | None = None
    # The offline mirror (offline.mirror); None: the mirror page says it is off.
    mirror: MirrorFiles | None = None
    # mirror.api and mirror.peers, as last asked (the mirror page).
    mirror_watch: MirrorWatch | None = None
    # The MCP tool servers behind /mcp (the MCP page); None: no MCP page.
    mcp: McpService | None = None
    # Guard policies and their decisions (the guard page); None: no guard page.
    guard: GuardService | None = None
    # The model explorer (the hub's models judged against the nodes); None: no Explore page.
    explore: ExploreService | None = None
    # Fine-tune jobs (the fine-tunes page); None: no fine-tunes page.
    finetunes: FinetuneService | None = None


@dataclass(frozen=True)
class PageCall:
    """One page request as its handler sees it."""

    request: Request
    session: Session
    form: dict[str, str] = field(default_factory=dict)

    @property
    def principal(self) -> Principal:
        return self.session.principal

    @property
    def params(self) -> Mapping[str, str]:
        """The path's parameters: each a text (no route of the pages converts one)."""
        return self.request.path_params

    @property
    def htmx(self) -> bool:
        """Asked by htmx for a part of the page, not the whole of it."""
        return self.request.headers.get("hx-request") == "true"


PageHandler = Callable[[PageCall], Awaitable[Response]]


@dataclass(frozen=True)
class Page:
    method: str
    path: str
    handler: PageHandler
    # ``member``: anyone signed in, a person without a cluster role too.
    role: Access = "viewer"


class Frame:
    """Templates, assets, sign-in state and the steps every page takes."""

    def __init__(
        self,
        gate: Gate,
        standby: Callable[[], Mapping[str, object] | None],
        body_timeout: float = 30.0,
        behind_tls: bool = False,
    ) -> None:
        if gate.sessions is None:
            raise ValueError("the admin pages need a gate that reads sessions")
        self.gate = gate
        # A form must arrive within this: a slow one cannot hold a connection.
        self.body_timeout = body_timeout
        # server.yaml's pages_behind_tls: the browser's page is https:// whatever the
        # connection here is.
        self.behind_tls = behind_tls
        self.sessions = gate.sessions
        self.standby = standby
        self.assets = Assets()
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("llmgw.server.pages", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["clock"] = clock
        self.env.filters["ago"] = ago
        self.env.filters["size"] = size

    def lang(self, request: Request) -> str:
        return i18n.pick(
            request.cookies.get(i18n.LANG_COOKIE), request.headers.get("accept-language", "")
        )

    def render(
        self,
        request: Request,
        template: str,
        session: Session | None,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        lang = self.lang(request)
        page = self.env.get_template(template).render(
            _=i18n.translator(lang),
            lang=lang,
            languages=i18n.LANGUAGES,
            asset=self.assets.url,
            session=session,
            may=lambda level: session is not None and allowed(session.principal, level),
            csrf=self.sessions.csrf(session) if session else "",
            path=request.url.path,
            now=time.time(),
            standby=self.standby(),
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def endpoint(self, page: Page) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            session = self.gate.session(request)
            if session is None:
                return secured(to_sign_in(request))
            lang = self.lang(request)
            _ = i18n.translator(lang)
            if not allowed(session.principal, page.role):
                return secured(
                    self.refuse(
                        request,
                        session,
                        403,
                        _("You may not do this: it needs the {role} role.", role=page.role),
                    )
                )
            try:
                form: dict[str, str] = {}
                if page.method != "GET":
                    refused = self.refuse_foreign(request, session)
                    if refused is not None:
                        return secured(refused)
                    form = await read_form(request, self.body_timeout)
                    token = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
                    if not self.sessions.csrf_ok(session, token):
                        text = _(STALE_FORM)
                        return secured(self.refuse(request, session, 403, text))
                    leader = self.standby()
                    if leader is not None:
                        where = str(leader.get("api_address") or leader.get("name") or "?")
                        text = _(STANDBY, leader=where)
                        return secured(self.refuse(request, session, 409, text))
                answer = await page.handler(PageCall(request, session, form))
            except Refusal as exc:
                answer = self.refuse(request, session, exc.status, exc.message)
            except schema.Invalid as exc:
                answer = self.refuse(request, session, 400, str(exc))
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                text = "the control plane failed to answer this page; its log says why"
                answer = self.refuse(request, session, 500, text)
            return secured(answer)

        run.__name__ = page.handler.__name__
        return run

    def refuse(self, request: Request, session: Session | None, status: int, text: str) -> Response:
        return self.render(request, "refused.html", session, status=status, message=text)

    def refuse_foreign(self, request: Request, session: Session | None) -> Response | None:
        """A 403 for a change another site's page sent (``foreign_origin``), else None."""
        origin = foreign_origin(request, self.behind_tls)
        if origin is None:
            return None
        _ = i18n.translator(self.lang(request))
        text = _(FOREIGN_FORM, origin=origin, site=site_origin(request, self.behind_tls))
        return self.refuse(request, session, 403, text)


def site_origin(request: Request, behind_tls: bool) -> str:
    """This site as the browser names it, for a message: the ``Host`` it asked for, over
    https when that is known (a TLS connection, or ``pages_behind_tls``)."""
    scheme = "https" if behind_tls or request.url.scheme == "https" else "http"
    return f"{scheme}://{request.headers.get('host', '')}"


def _host_port(netloc: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of a ``Host`` header or an origin's, its port filled in from the
    scheme; None when unreadable."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path or parts.query:
        return None
    return parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def foreign_origin(request: Request, behind_tls: bool) -> str | None:
    """Who sent a change, when it was not this site's own page; None when it was.

    Same origin: the request's ``Origin`` names the host and port the browser asked for
    (its ``Host`` header, which a VIP, or a proxy that passes ``Host`` on, keeps), over
    https when the connection is TLS or ``pages_behind_tls`` says a proxy ends TLS, else
    over http or https (a proxy may end TLS without saying so). ``null``, another host,
    port or scheme: refused. Without an ``Origin``, ``Sec-Fetch-Site`` must be
    ``same-origin`` (or ``none``: the user's own action); ``same-site`` and
    ``cross-site`` are refused. A request with neither is not from a browser (browsers
    send ``Origin`` with every POST), so no other site can have made it with the user's
    cookie: it is let through, and still needs the session's CSRF token."""
    origin = request.headers.get("origin")
    if origin is None:
        fetch_site = request.headers.get("sec-fetch-site")
        if fetch_site is None or fetch_site in ("same-origin", "none"):
            return None
        return f"Sec-Fetch-Site: {fetch_site}"[:200]
    tls = behind_tls or request.url.scheme == "https"
    scheme, sep, netloc = origin.strip().partition("://")
    if sep and scheme in (("https",) if tls else tuple(DEFAULT_PORTS)) and "/" not in netloc:
        theirs = _host_port(netloc, scheme)
        ours = _host_port(request.headers.get("host", ""), scheme)
        if theirs is not None and theirs == ours:
            return None
    return origin[:200] or "Origin: (empty)"


async def read_form(request: Request, timeout: float) -> dict[str, str]:
    """A urlencoded form's fields (the pages send no other kind), refused past
    ``MAX_FORM`` bytes or when it has not arrived within ``timeout`` seconds."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_FORM:
        raise Refusal(413, "body_too_large", "the form is over 64 KiB")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = b""
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_FORM:
                    raise Refusal(413, "body_too_large", "the form is over 64 KiB")
    except TimeoutError:
        raise Refusal(
            408, "body_timeout", f"the form did not arrive within {timeout:g} s"
        ) from None
    if not body:
        return {}
    if kind != "application/x-www-form-urlencoded":
        raise Refusal(415, "unsupported_media_type", "send the form urlencoded")
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=200)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refusal(400, "bad_request", f"the form cannot be read: {exc}") from None
    return dict(pairs)


def form_body(
    form: Mapping[str, str], texts: tuple[str, ...] = (), numbers: tuple[str, ...] = ()
) -> dict[str, object]:
    """An API body from a form: each of ``texts`` and ``numbers`` given (blank fields left
    out, for the API's defaults), numbers read as whole numbers or refused by name."""
    body: dict[str, object] = {}
    for name in texts:
        text = form.get(name, "").strip()
        if text:
            body[name] = text
    for name in numbers:
        text = form.get(name, "").strip()
        if text:
            if not text.isdigit():
                raise Refusal(400, "bad_request", f"{name}: {text!r} is not a whole number")
            body[name] = int(text)
    return body


def to_sign_in(request: Request) -> Response:
    """Where someone without a session goes: the sign-in page, coming back here after."""
    back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    target = "/admin/login?next=" + quote(back, safe="/")
    if request.headers.get("hx-request") == "true":
        return Response(status_code=204, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


def secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def safe_next(target: str | None) -> str:
    """A sign-in's way back: a path under /admin on this site, never elsewhere."""
    if not target or not target.startswith("/admin") or target.startswith("//"):
        return "/admin"
    if any(c in target for c in "\\\r\n") or target.startswith("/admin/login"):
        return "/admin"
    return target


def clock(at: float | None) -> str:
    """A time of day in UTC, or an em dash when there is none."""
    if at is None:
        return "—"
    return time.strftime("%H:%M:%S", time.gmtime(at))


def ago(at: float | None, now: float | None = None) -> str:
    if at is None:
        return "—"
    seconds = max(0, int((time.time() if now is None else now) - at))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def size(n: float | None) -> str:
    """Bytes in binary units, or an em dash when not read."""
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
