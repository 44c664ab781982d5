"""One authorisation point: every route of the real admin app is declared with who may
call it, and every one that is not on the public list refuses a caller without the
admin token (or with a wrong one) in the same OpenAI-style JSON, before reading a byte
of its body. A route added later is walked here too, so it cannot forget."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

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
    ("GET", "/admin"),
    ("GET", "/admin/{rest:path}"),
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
