"""One authorisation point: every route of the real admin app is declared with who may
call it, and every one that is not on the public list refuses a caller without the
admin token (or with a wrong one) in the same OpenAI-style JSON, before reading a byte
of its body. A route added later is walked here too, so it cannot forget."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.routing import Route

from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.store import open_store

# The routes anyone may call, on purpose. Adding one here is a decision; the test below
# fails for a public route missing from this list as much as for an open admin route.
PUBLIC = {
    ("GET", "/healthz"),
    ("GET", "/api/v1/version"),
    ("GET", "/api/v1/openapi.json"),
    ("POST", "/api/v1/enroll"),
    ("GET", "/leader"),
    ("POST", "/api/v1/servers/join"),
    # `llmgw login`: ctl has no token yet; nothing is given until a person approves.
    ("POST", "/api/v1/login/device"),
    ("POST", "/api/v1/login/device/token"),
}
# The admin pages anyone may open: signing in and out, the language, the static files.
PUBLIC_PAGES = {
    ("GET", "/admin/login"),
    ("POST", "/admin/login"),
    ("POST", "/admin/logout"),
    # Signing in through the cluster's OIDC provider (tests/e2e/test_oidc.py).
    ("GET", "/admin/login/oidc"),
    ("GET", "/admin/login/oidc/callback"),
    ("GET", "/admin/lang/{lang}"),
    ("GET", "/admin/static/{name}"),
    # Any other path under /admin: 404, with the pages' headers.
    ("GET", "/admin/{rest:path}"),
    ("POST", "/admin/{rest:path}"),
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("cp") / "data"
    # Nothing listens: the app is called in process.
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@pytest.fixture
async def cp(data_dir: tuple[Path, str]) -> AsyncIterator[ControlPlane]:
    root, _ = data_dir
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    plane = ControlPlane(data, config, store)
    await plane.load()
    try:
        yield plane
    finally:
        await plane.gateway.close()
        await plane.inspector.close()
        await store.close()


def concrete(path: str) -> str:
    """A path template with each parameter filled in."""
    return re.sub(r"\{[^}]+\}", "x", path)


async def test_every_route_but_the_public_list_wants_the_admin_token(
    cp: ControlPlane, data_dir: tuple[Path, str]
) -> None:
    ops = cp.routes()
    public = {(op.method, op.path) for op in ops if op.access == "public"}
    assert public == PUBLIC
    guarded = [op for op in ops if op.access != "public"]
    assert len(guarded) >= 30  # the whole admin API, not a handful
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        for op in guarded:
            for headers in ({}, {"authorization": "Bearer not-the-token"}, {"authorization": "x"}):
                # A body that would be refused if it were read: the gate answers first.
                answer = await client.request(
                    op.method, concrete(op.path), headers=headers, content=b"{not json"
                )
                where = f"{op.method} {op.path} with {headers or 'no token'}"
                assert answer.status_code == 401, where
                error = answer.json()["error"]
                assert set(error) >= {"message", "type", "code", "param"}, where
                assert error["type"] == "unauthorized" and error["message"], where
        # The right token passes the gate (what the route then says is its own business).
        _, token = data_dir
        ok = await client.get("/api/v1/status", headers={"authorization": f"Bearer {token}"})
        # Not running, it leads nothing yet: `leader` says so rather than assuming.
        assert ok.status_code == 200 and ok.json()["leader"] is False


async def test_every_admin_page_without_a_session_goes_to_sign_in(
    cp: ControlPlane, data_dir: tuple[Path, str]
) -> None:
    app = cp.admin_app()
    pages = [
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route) and route.path.startswith("/admin")
        for method in sorted(route.methods or ())
        if method != "HEAD"
    ]
    assert PUBLIC_PAGES <= set(pages)
    guarded = [p for p in pages if p not in PUBLIC_PAGES]
    assert len(guarded) >= 15  # every page, not a handful
    _, token = data_dir
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        for method, path in guarded:
            # Neither the admin token as a bearer nor a forged cookie opens a page.
            for headers in (
                {},
                {"authorization": f"Bearer {token}"},
                {"cookie": "llmgw_session=e30.forged"},
            ):
                answer = await client.request(method, concrete(path), headers=headers)
                where = f"{method} {path} with {headers or 'nothing'}"
                assert answer.status_code == 303, where
                assert answer.headers["location"].startswith("/admin/login?next=/admin"), where
                assert "default-src 'none'" in answer.headers["content-security-policy"], where
                assert answer.headers["x-frame-options"] == "DENY", where
        # htmx is told where to go rather than handed a redirect to swap in.
        answer = await client.get("/admin/nodes", headers={"hx-request": "true"})
        assert answer.status_code == 204 and answer.headers["hx-redirect"].startswith(
            "/admin/login?next="
        )
        # Signed in, a page opens; its session cookie is no key to the API.
        signed = await client.post("/admin/login", data={"token": token})
        assert signed.status_code == 303 and signed.headers["location"] == "/admin"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        session = {"cookie": cookie.split(";")[0]}
        assert (await client.get("/admin/nodes", headers=session)).status_code == 200
        assert (await client.get("/api/v1/keys", headers=session)).status_code == 401


async def test_failed_sign_ins_are_limited_per_address(
    cp: ControlPlane, data_dir: tuple[Path, str]
) -> None:
    _, token = data_dir
    app = cp.admin_app()

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://cp")

    async with client("10.0.0.7") as guesser, client("10.0.0.8") as other:
        for i in range(5):
            wrong = await guesser.post("/admin/login", data={"token": f"wrong-{i}"})
            assert wrong.status_code == 401 and "not an admin token" in wrong.text
        # Past the limit even the right token waits, and says how long.
        held = await guesser.post("/admin/login", data={"token": token})
        assert held.status_code == 429 and int(held.headers["retry-after"]) > 0
        assert "Too many failed sign-ins" in held.text
        # Another address is not held by this one's failures.
        ok = await other.post("/admin/login", data={"token": token})
        assert ok.status_code == 303


async def test_the_pages_answer_odd_and_hostile_requests_without_failing(
    cp: ControlPlane, data_dir: tuple[Path, str]
) -> None:
    _, token = data_dir
    cp.config = dataclasses.replace(cp.config, pages_behind_tls=True)
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:

        def csp(answer: httpx.Response) -> bool:
            return "default-src 'none'" in answer.headers.get("content-security-policy", "")

        # A cookie with a character compare_digest refuses: no session, not a failure.
        odd = await client.get(
            "/admin/nodes", headers={"cookie": "llmgw_session=e30.\xe9".encode("latin-1")}
        )
        assert odd.status_code == 303 and csp(odd)
        # A sign-in posted by another site's page is refused and not counted.
        foreign = await client.post(
            "/admin/login", data={"token": token}, headers={"origin": "https://evil.example"}
        )
        assert foreign.status_code == 403 and csp(foreign)
        signed = await client.post("/admin/login", data={"token": token})
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"]
        assert "Secure" in cookie  # pages_behind_tls
        session = {"cookie": cookie.split(";")[0]}
        bad_token = await client.post("/admin/keys", data={"csrf": "\xe9"}, headers=session)
        assert bad_token.status_code == 403 and csp(bad_token)
        as_json = await client.post(
            "/admin/keys", content=b"{}", headers={**session, "content-type": "application/json"}
        )
        assert as_json.status_code == 415 and csp(as_json)
        too_big = await client.post("/admin/keys", data={"name": "x" * 70_000}, headers=session)
        assert too_big.status_code == 413 and csp(too_big)
        missing = await client.get("/admin/no-such-page", headers=session)
        assert missing.status_code == 404 and csp(missing)
        page = await client.get("/admin", headers=session)
        script = re.search(r'src="(/admin/static/admin\.[0-9a-f]{12}\.js)"', page.text)
        assert script is not None
        static = await client.get(script.group(1))
        assert static.status_code == 200 and csp(static)
        assert "immutable" in static.headers["cache-control"]


async def test_a_page_change_from_another_sites_page_is_refused_with_a_valid_token(
    cp: ControlPlane, data_dir: tuple[Path, str]
) -> None:
    _, token = data_dir
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        signed = await client.post(
            "/admin/login", data={"token": token}, headers={"origin": "http://cp"}
        )
        assert signed.status_code == 303
        session = {"cookie": signed.headers["set-cookie"].split(";")[0]}
        page = await client.get("/admin/keys", headers=session)
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found is not None
        form = {"csrf": found.group(1), "name": "from-evil"}

        async def names() -> set[str]:
            return {k.name for k in await cp.store.list_api_keys()}

        for foreign in (
            {"origin": "https://evil.example"},
            {"origin": "null"},
            {"origin": "http://cp:8081"},
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "same-site"},
        ):
            refused = await client.post("/admin/keys", data=form, headers={**session, **foreign})
            assert refused.status_code == 403, foreign
            assert "nothing was changed" in refused.text, foreign
            assert "default-src 'none'" in refused.headers["content-security-policy"]
        # htmx's own requests carry the token as a header: the origin is checked the same.
        htmx = {**session, "x-csrf-token": found.group(1), "hx-request": "true"}
        refused = await client.post(
            "/admin/keys", data={"name": "from-evil"}, headers={**htmx, "origin": "https://e.x"}
        )
        assert refused.status_code == 403
        assert "from-evil" not in await names()
        # The same form from this site's own page is taken.
        taken = await client.post(
            "/admin/keys", data=form, headers={**session, "origin": "http://cp"}
        )
        assert taken.status_code == 200 and "from-evil" in await names()
        ours = {**session, "sec-fetch-site": "same-origin"}
        form["name"] = "fetched-here"
        assert (await client.post("/admin/keys", data=form, headers=ours)).status_code == 200
        assert "fetched-here" in await names()
        # Sign-out is a change too: another site cannot end the session...
        out = {"csrf": found.group(1)}
        evil = {**session, "origin": "https://evil.example"}
        assert (await client.post("/admin/logout", data=out, headers=evil)).status_code == 403
        assert (await client.get("/admin/nodes", headers=session)).status_code == 200
        # ...this site's page can.
        here = {**session, "origin": "http://cp"}
        assert (await client.post("/admin/logout", data=out, headers=here)).status_code == 303
        assert (await client.get("/admin/nodes", headers=session)).status_code == 303
