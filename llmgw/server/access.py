"""The one authorisation point: who a request's caller is, for the admin API and the
admin pages alike.

The API takes a bearer token alone (no cookie can send an API call); the pages take
their signed session cookie alone (``sessions.py``). Either way the answer is a
``Principal`` the services are handed, or None: the caller may not call. The edges turn
None into their own refusal (the API's 401, the pages' way to sign in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from starlette.requests import Request

from llmgw.server.principal import Principal
from llmgw.server.sessions import COOKIE, Session, Sessions

# Who may call a route: anyone, or a caller holding the admin token.
Access = Literal["public", "admin"]


class Gate:
    def __init__(
        self,
        admin_token_ok: Callable[[str], bool],
        standby: Callable[[], Mapping[str, object] | None],
        sessions: Sessions | None = None,
    ) -> None:
        self.admin_token_ok = admin_token_ok
        # On a standby: the leader, where writes go; None while this one leads.
        self.standby = standby
        # The admin pages' signed sessions; None: this app serves no pages.
        self.sessions = sessions

    def session(self, request: Request) -> Session | None:
        """The admin pages' caller: a valid session cookie, or None."""
        if self.sessions is None:
            return None
        return self.sessions.read(request.cookies.get(COOKIE))

    def principal(self, request: Request, access: Access) -> Principal | None:
        """The API's caller: anyone for a public route, else the admin token's holder."""
        host = request.client.host if request.client else "?"
        if access == "public":
            return Principal.anonymous(host)
        header = request.headers.get("authorization", "")
        if header[:7].lower() == "bearer " and self.admin_token_ok(header[7:].strip()):
            return Principal(f"admin@{host}", "admin", "token")
        return None
