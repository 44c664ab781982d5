"""The guard page of a real control plane, called in process over its SQLite store
through the pages' own steps (session, role, CSRF, headers) and the real
``GuardService``."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw import pki
from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.guard.reading import Decision
from llmgw.server.sessions import COOKIE
from llmgw.server.store import open_store


class Site:
    def __init__(self, cp: ControlPlane, client: httpx.AsyncClient, token: str) -> None:
        self.cp, self.client, self.token = cp, client, token

    def as_(self, role: str) -> dict[str, str]:
        cookie = self.cp.sessions.open(f"{role}@test", role, pki.token_hash(self.token))  # type: ignore[arg-type]
        return {"cookie": f"{COOKIE}={cookie}"}

    def csrf(self, headers: dict[str, str]) -> str:
        session = self.cp.sessions.read(headers["cookie"].split("=", 1)[1])
        assert session is not None
        return self.cp.sessions.csrf(session)

    async def post(self, path: str, role: str, **fields: str) -> httpx.Response:
        headers = self.as_(role)
        return await self.client.post(
            path, data={**fields, "csrf": self.csrf(headers)}, headers=headers
        )

    async def page(self, path: str, role: str = "admin") -> str:
        answer = await self.client.get(path, headers=self.as_(role))
        assert answer.status_code == 200, answer.text
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        return answer.text

    async def api(self, method: str, path: str, body: object | None = None) -> object:
        answer = await self.client.request(
            method, path, json=body, headers={"authorization": f"Bearer {self.token}"}
        )
        assert answer.status_code < 300, answer.text
        return answer.json()


@pytest.fixture
def data_dir(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "data"
    _, token = init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    return root, token


@pytest.fixture
async def site(data_dir: tuple[Path, str]) -> AsyncIterator[Site]:
    root, token = data_dir
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    transport = httpx.ASGITransport(app=cp.admin_app())
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            yield Site(cp, client, token)
    finally:
        await cp.gateway.close()
        await cp.inspector.close()
        await store.close()


def text(page: str) -> str:
    words = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return re.sub(r" ([,:;)])", r"\1", words)


def row(page: str, id_: str) -> str:
    found = re.search(rf'<tr id="{id_}"[^>]*>(.*?)</tr>', page, re.S)
    assert found is not None, id_
    return text(found.group(1)).strip()


async def test_the_guard_page_lists_policies_and_recent_decisions(site: Site) -> None:
    assert 'id="no-policies"' in await site.page("/admin/guard", "operator")
    operator = await site.post("/admin/guard/policies", "operator", name="pii")
    assert operator.status_code == 403
    answer = await site.post(
        "/admin/guard/policies", "admin", name="pii", pii="block", injection="flag", wait_ms="500"
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/guard#policy-pii"
    bad = await site.post("/admin/guard/policies", "admin", name="j", judge="no-such-model")
    assert bad.status_code == 400 and "no model named no-such-model" in bad.text
    # Nothing counted yet: a dash, not a row of zeros.
    assert row(await site.page("/admin/guard", "operator"), "policy-pii").endswith("refuse —")
    site.cp.guard.record(
        Decision(time.time(), "pii", "block", "ci", "tool_args tickets.create", "email at 3-20")
    )
    page = await site.page("/admin/guard", "operator")
    assert row(page, "policy-pii") == "pii pattern rules only flag block 500 ms refuse block 1"
    said = text(page)
    assert "pii block ci tool_args tickets.create email at 3-20" in said
    # An operator reads; only an admin gets the forms.
    assert 'id="guard-add"' not in page and 'id="remove-pii"' not in page
    admin = await site.page("/admin/guard?policy=pii")
    assert 'id="guard-add"' in admin
    assert 'id="no-decisions"' in await site.page("/admin/guard?policy=other")
    answer = await site.post("/admin/guard/policies/pii/remove", "admin")
    assert answer.status_code == 303
    assert 'id="no-policies"' in await site.page("/admin/guard")
    # The decision's audit entry is written within a second or so: waited for, so the
    # store is not closed under it.
    for _ in range(100):
        if any("guard.block" in str(e) for e in await site.cp.store.audit_log(50)):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the decision was never audited")


async def test_the_guard_page_speaks_turkish(site: Site) -> None:
    headers = {**site.as_("operator"), "accept-language": "tr-TR,tr;q=0.9"}
    guard = (await site.client.get("/admin/guard", headers=headers)).text
    assert "Son kararlar" in guard and "Henüz koruma politikası yok" in guard
