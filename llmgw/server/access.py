"""The one authorisation point: who a request's caller is, and whether their role
reaches what the route or page needs, for the admin API and the admin pages alike.

The API takes a bearer token alone (no cookie can send an API call): the admin token
(bootstrap and recovery: every right), or a person's personal token (``llmgw-pat-``),
which acts as the person with their cluster role and memberships as they are now. The
pages take their signed session cookie alone (``sessions.py``); a person's session too
is read against the directory at every request, so a deactivated person is refused at
once. Either way the answer is a ``Principal`` the services are handed.

Each route declares the least it needs (``Access``): ``public`` (anyone), ``member``
(anyone signed in: the service decides by their memberships), ``metrics`` (the
cluster's metrics token, which Prometheus holds and opens nothing else, or a viewer),
or a cluster role, ``viewer`` < ``operator`` < ``admin``. No caller is a 401; a caller
whose role falls short is a 403 naming the role (``Denied``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Literal

from starlette.requests import Request

from llmgw import pki
from llmgw.server.people.directory import Directory
from llmgw.server.principal import Principal, is_role
from llmgw.server.sessions import COOKIE, Session, Sessions

Access = Literal["public", "member", "metrics", "viewer", "operator", "admin"]
ACCESS: tuple[Access, ...] = ("public", "member", "metrics", "viewer", "operator", "admin")


class Denied(Exception):
    """No caller (401) or one whose role falls short (403); the message says which."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def allowed(principal: Principal, access: Access) -> bool:
    if access == "public":
        return True
    if access == "member":
        return principal.known
    if access == "metrics":
        return principal.via == "metrics" or principal.may("viewer")
    return is_role(access) and principal.may(access)


class Gate:
    def __init__(
        self,
        admin_token_ok: Callable[[str], bool],
        standby: Callable[[], Mapping[str, object] | None],
        sessions: Sessions | None = None,
        directory: Directory | None = None,
    ) -> None:
        self.admin_token_ok = admin_token_ok
        # On a standby: the leader, where writes go; None while this one leads.
        self.standby = standby
        # The admin pages' signed sessions; None: this app serves no pages.
        self.sessions = sessions
        # People and their tokens; None: only the admin token opens the API.
        self.directory = directory
        # The cluster's metrics token (``pki.metrics_token``); None: there is none.
        self.metrics_token: str | None = None

    def session(self, request: Request) -> Session | None:
        """The admin pages' caller: a valid session cookie (a person's: one still
        active, acting as they are now), or None."""
        if self.sessions is None:
            return None
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is None or session.person is None:
            return session
        who = None if self.directory is None else self.directory.session_principal(session.person)
        return None if who is None else replace(session, role=who.role, who=who)

    def caller(self, request: Request) -> Principal | None:
        """Who a bearer token says the caller is: the admin token's holder or a person."""
        header = request.headers.get("authorization", "")
        if header[:7].lower() != "bearer ":
            return None
        token = header[7:].strip()
        if self.admin_token_ok(token):
            host = request.client.host if request.client else "?"
            return Principal(f"admin@{host}", "admin", "token")
        if self.metrics_token is not None and pki.same(token, self.metrics_token):
            host = request.client.host if request.client else "?"
            return Principal(f"metrics@{host}", None, "metrics")
        if self.directory is not None:
            return self.directory.by_token(token)
        return None

    def principal(self, request: Request, access: Access) -> Principal:
        """The API's caller, allowed ``access``; else ``Denied``."""
        if access == "public":
            return Principal.anonymous(request.client.host if request.client else "?")
        found = self.caller(request)
        if found is None:
            raise Denied(
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>' with a personal "
                "token (`llmgw login`) or the admin token from the data dir's admin.token",
            )
        if not allowed(found, access):
            raise Denied(403, f"{found.name} may not do this: it needs the {access} role")
        return found
