"""Signed sessions, their CSRF tokens, the sign-in limit and the way back after sign-in."""

from __future__ import annotations

import base64
import json

from llmgw.server.pages.frame import safe_next
from llmgw.server.sessions import Sessions, SignInLimiter

SECRET = b"k" * 32


def sessions(hashes: list[str], ttl: float = 3600.0) -> Sessions:
    return Sessions(SECRET, lambda: hashes, ttl=ttl)


def test_a_session_reads_back_and_its_csrf_token_is_its_own() -> None:
    s = sessions(["hash-a"])
    cookie = s.open("admin@10.0.0.1", "admin", "hash-a", now=1000.0)
    read = s.read(cookie, now=1001.0)
    assert read is not None and (read.actor, read.role) == ("admin@10.0.0.1", "admin")
    assert read.may("operator") and read.may("viewer")
    other = s.read(s.open("admin@10.0.0.1", "admin", "hash-a", now=1000.0), now=1001.0)
    assert other is not None
    assert s.csrf_ok(read, s.csrf(read))
    assert not s.csrf_ok(read, s.csrf(other))  # another session's token
    assert not s.csrf_ok(read, None) and not s.csrf_ok(read, "")


def test_an_altered_expired_or_foreign_cookie_is_no_session() -> None:
    s = sessions(["hash-a"], ttl=60)
    cookie = s.open("admin@x", "viewer", "hash-a", now=1000.0)
    body, signature = cookie.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["r"] = "admin"  # a viewer making itself admin
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert s.read(f"{forged}.{signature}", now=1001.0) is None
    assert s.read(cookie, now=1061.0) is None  # past its end
    assert s.read(cookie + "x", now=1001.0) is None
    assert s.read("", now=1001.0) is None and s.read("a.b.c", now=1001.0) is None
    elsewhere = Sessions(b"another cluster's secret", lambda: ["hash-a"])
    assert elsewhere.read(cookie, now=1001.0) is None
    viewer = s.read(cookie, now=1001.0)
    assert viewer is not None and viewer.may("viewer") and not viewer.may("operator")


def test_rotating_the_admin_token_and_signing_out_end_sessions() -> None:
    hashes = ["hash-a"]
    s = sessions(hashes)
    cookie = s.open("admin@x", "admin", "hash-a", now=1000.0)
    assert s.read(cookie, now=1001.0) is not None
    hashes[:] = ["hash-b"]  # the token it was opened with is gone
    assert s.read(cookie, now=1001.0) is None
    hashes[:] = ["hash-a", "hash-b"]
    session = s.read(cookie, now=1001.0)
    assert session is not None
    s.end(session, now=1002.0)
    assert s.read(cookie, now=1003.0) is None


def test_failed_sign_ins_are_counted_per_address_in_a_window() -> None:
    limit = SignInLimiter(limit=3, window=60)
    for t in (0.0, 1.0, 2.0):
        assert limit.wait("a", now=t) == 0
        limit.failed("a", now=t)
    assert limit.wait("a", now=3.0) == 57.0  # until the first failure ages out
    assert limit.wait("b", now=3.0) == 0  # another address is not held
    assert limit.wait("a", now=60.5) == 0
    limit.failed("b", now=4.0)
    limit.succeeded("b")
    assert limit.wait("b", now=5.0) == 0


def test_the_addresses_remembered_are_bounded() -> None:
    limit = SignInLimiter(limit=1, window=60, addresses=2)
    for address in ("a", "b", "c"):
        limit.failed(address, now=0.0)
    assert limit.wait("a", now=1.0) == 0  # forgotten, oldest first
    assert limit.wait("c", now=1.0) > 0


def test_the_way_back_after_sign_in_stays_on_the_admin_pages() -> None:
    assert safe_next("/admin/nodes?q=gpu") == "/admin/nodes?q=gpu"
    for bad in (
        None,
        "",
        "https://evil.example/",
        "//evil.example/admin",
        "/api/v1/keys",
        "/admin\\@evil",
        "/admin/login?next=/admin",
        "/admin\r\nSet-Cookie: x",
    ):
        assert safe_next(bad) == "/admin", bad


def test_sessions_signed_out_elsewhere_are_refused_until_they_would_have_ended() -> None:
    s = sessions(["hash-a"])
    first = s.read(s.open("admin@x", "admin", "hash-a", now=1000.0), now=1000.0)
    second_cookie = s.open("admin@y", "admin", "hash-a", now=1000.0)
    assert first is not None
    s.end(first, now=1001.0)
    # What the store says was signed out joins what was signed out here.
    second = s.read(second_cookie, now=1001.0)
    assert second is not None
    s.ended({second.sid: second.expires}, now=1001.0)
    assert s.read(second_cookie, now=1002.0) is None
    # An id past its end is forgotten (the cookie is refused by its end anyway).
    s.ended({"long-gone": 999.0, "later": 5000.0}, now=1002.0)
    assert set(s._ended) == {first.sid, second.sid, "later"}
