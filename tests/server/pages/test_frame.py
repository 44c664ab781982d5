"""What every page's form reading refuses: a form too slow to arrive, too large, or of
another kind; and whose changes count as this site's own (Origin, Sec-Fetch-Site)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from llmgw.server.pages.frame import foreign_origin, read_form
from llmgw.server.refusal import Refusal


def request(chunks: list[bytes], headers: dict[str, str], stall: bool = False) -> Request:
    queue = list(chunks)

    async def receive() -> dict[str, object]:
        if queue:
            return {"type": "http.request", "body": queue.pop(0), "more_body": True}
        if stall:
            await asyncio.Event().wait()  # a client that sends no more
        return {"type": "http.request", "body": b"", "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request(
        {"type": "http", "method": "POST", "path": "/admin/keys", "headers": raw}, receive
    )


FORM = {"content-type": "application/x-www-form-urlencoded"}


async def test_a_form_reads_as_its_fields() -> None:
    got = await read_form(request([b"name=a%20b&csrf=", b"x&models="], FORM), 1.0)
    assert got == {"name": "a b", "csrf": "x", "models": ""}


async def test_a_form_that_stops_arriving_is_refused_in_time() -> None:
    slow = request([b"name=a"], {**FORM, "content-length": "65536"}, stall=True)
    with pytest.raises(Refusal) as refused:
        await read_form(slow, 0.2)
    assert refused.value.status == 408


async def test_a_large_form_or_another_kind_is_refused() -> None:
    with pytest.raises(Refusal) as big:
        await read_form(request([b"x" * 70_000], FORM), 1.0)
    assert big.value.status == 413
    with pytest.raises(Refusal) as said_large:
        await read_form(request([], {**FORM, "content-length": "70000"}), 1.0)
    assert said_large.value.status == 413
    with pytest.raises(Refusal) as kind:
        await read_form(request([b"{}"], {"content-type": "application/json"}), 1.0)
    assert kind.value.status == 415


def sent(headers: dict[str, str], scheme: str = "http") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": "POST", "scheme": scheme, "path": "/admin/keys"}
    return Request({**scope, "headers": raw})


def test_a_change_from_this_sites_own_page_is_let_through() -> None:
    host = {"host": "cp.example:8080"}
    assert foreign_origin(sent({**host, "origin": "http://cp.example:8080"}), False) is None
    # A proxy may end TLS without saying so: https on the same host and port counts.
    assert foreign_origin(sent({**host, "origin": "https://cp.example:8080"}), False) is None
    # Host names are not case-sensitive; a default port may be written or not.
    assert foreign_origin(sent({**host, "origin": "http://CP.example:8080"}), False) is None
    tls = {"host": "admin.example", "origin": "https://admin.example"}
    assert foreign_origin(sent(tls), True) is None
    assert foreign_origin(sent({**tls, "host": "admin.example:443"}), True) is None
    assert foreign_origin(sent(tls, scheme="https"), False) is None
    # A VIP keeps the Host the browser asked for.
    vip = {"host": "10.0.0.100:8080", "origin": "http://10.0.0.100:8080"}
    assert foreign_origin(sent(vip), False) is None
    ipv6 = {"host": "[fd00::1]:8080", "origin": "http://[fd00::1]:8080"}
    assert foreign_origin(sent(ipv6), False) is None


def test_a_change_from_another_origin_is_named_and_refused() -> None:
    host = {"host": "cp.example:8080"}
    for origin in (
        "https://evil.example",
        "http://cp.example",  # another port
        "http://cp.example:8081",
        "http://cp.example.evil.example:8080",
        "http://user@cp.example:8080",
        "http://cp.example:8080/path",
        "null",  # a sandboxed frame, a redirect across sites
        "cp.example:8080",
        "ftp://cp.example:8080",
    ):
        assert foreign_origin(sent({**host, "origin": origin}), False) == origin, origin
    assert foreign_origin(sent({**host, "origin": ""}), False) == "Origin: (empty)"
    # Known to be TLS: plain http from the same host is another origin.
    tls = {"host": "admin.example", "origin": "http://admin.example"}
    assert foreign_origin(sent(tls), True) == "http://admin.example"
    assert foreign_origin(sent(tls, scheme="https"), False) == "http://admin.example"
    # No Host to compare with: nothing is this site's.
    assert foreign_origin(sent({"origin": "http://cp.example:8080"}), False) is not None


def test_without_an_origin_sec_fetch_site_decides_and_a_client_with_neither_is_no_browser() -> None:
    host = {"host": "cp.example:8080"}
    assert foreign_origin(sent({**host, "sec-fetch-site": "same-origin"}), False) is None
    assert foreign_origin(sent({**host, "sec-fetch-site": "none"}), False) is None
    for site in ("same-site", "cross-site"):
        found = foreign_origin(sent({**host, "sec-fetch-site": site}), False)
        assert found == f"Sec-Fetch-Site: {site}"
    # curl or a script: no browser sent it, so no other site did; the CSRF token still
    # stands in its way (tested with the pages themselves).
    assert foreign_origin(sent(host), False) is None
    # Origin, when sent, is what counts.
    both = {**host, "origin": "https://evil.example", "sec-fetch-site": "same-origin"}
    assert foreign_origin(sent(both), False) == "https://evil.example"
