"""``Gate``, the one authorisation point: a public route gives an anonymous caller
named by its address; an admin route takes the admin token as a bearer token alone,
and a page's session cookie (however valid) never authorises the API; the pages take
their session cookie alone."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from llmgw import pki
from llmgw.server.access import Denied, Gate
from llmgw.server.principal import Principal
from llmgw.server.sessions import COOKIE, Sessions

TOKEN = "llmgw-admin-the-right-one"
HASHES = [pki.token_hash(TOKEN)]
SESSIONS = Sessions(b"s" * 32, lambda: HASHES)


def request(
    headers: dict[str, str] | None = None,
    cookies: dict[str, str] | None = None,
    client: tuple[str, int] | None = ("10.0.0.5", 50123),
) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookies:
        raw.append((b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode()))
    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/api/v1/nodes",
        "headers": raw,
    }
    if client is not None:
        scope["client"] = client
    return Request(scope)


def gate(sessions: Sessions | None = SESSIONS) -> Gate:
    return Gate(lambda token: pki.token_hash(token) in HASHES, lambda: None, sessions)


def test_a_public_route_gives_an_anonymous_caller_named_by_its_address() -> None:
    caller = gate().principal(request(), "public")
    assert caller == Principal("anonymous@10.0.0.5", None, "anonymous")
    assert not caller.may("viewer")
    # Holding the token changes nothing on a public route: nobody is named admin there.
    bearer = request({"Authorization": f"Bearer {TOKEN}"})
    assert gate().principal(bearer, "public") == caller
    assert gate().principal(request(client=None), "public") == Principal.anonymous("?")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_admin_token_as_a_bearer_token_names_the_admin_at_its_address(scheme: str) -> None:
    caller = gate().principal(request({"Authorization": f"{scheme}  {TOKEN} "}), "admin")
    assert caller == Principal("admin@10.0.0.5", "admin", "token")
    assert caller.may("admin")


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Bearer llmgw-admin-a-wrong-one",
        f"Basic {TOKEN}",
        TOKEN,
        f"Token {TOKEN}",
    ],
)
def test_anything_but_the_admin_bearer_token_is_no_caller(header: str) -> None:
    headers = {"Authorization": header} if header else {}
    assert gate().caller(request(headers)) is None
    with pytest.raises(Denied) as refused:
        gate().principal(request(headers), "viewer")
    assert refused.value.status == 401 and "Bearer" in refused.value.message


def test_a_valid_session_cookie_never_authorises_the_api() -> None:
    cookie = SESSIONS.open("admin@10.0.0.5", "admin", HASHES[0])
    with_cookie = request(cookies={COOKIE: cookie})
    # The pages take it...
    session = gate().session(with_cookie)
    assert session is not None and session.principal.via == "session"
    assert session.principal.name == "admin@10.0.0.5" and session.may("admin")
    # ...the API does not, not even with the token sent as a cookie.
    assert gate().caller(with_cookie) is None
    as_cookie = request(cookies={COOKIE: cookie, "authorization": f"Bearer {TOKEN}"})
    assert gate().caller(as_cookie) is None
    with pytest.raises(Denied):
        gate().principal(as_cookie, "member")


def test_the_pages_take_their_session_cookie_alone() -> None:
    bearer = request({"Authorization": f"Bearer {TOKEN}"})
    assert gate().session(bearer) is None
    assert gate().session(request(cookies={COOKIE: "forged.cookie"})) is None
    # An app that serves no pages has no sessions at all.
    cookie = SESSIONS.open("admin@10.0.0.5", "admin", HASHES[0])
    assert gate(sessions=None).session(request(cookies={COOKIE: cookie})) is None


def test_the_gate_keeps_who_leads_for_the_routes_that_write() -> None:
    leader = {"name": "cp-a", "api_address": "10.0.0.1:8080"}
    standby = Gate(lambda token: False, lambda: leader)
    assert standby.standby() == leader and gate().standby() is None
