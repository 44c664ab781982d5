"""The MCP page of a real control plane, called in process over its SQLite store
through the pages' own steps (session, role, CSRF, headers): the real ``McpService``
(with ``llmgw:admin`` built in), keys and their grants set through the admin API as
``ctl keys limits`` sets them."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llmgw import pki
from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.sessions import COOKIE
from llmgw.server.store import open_store

BEARER = "tok-3f9a-never-shown"


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


async def test_the_mcp_page_is_for_admins_and_shows_llmgw_admin(site: Site) -> None:
    for role in ("viewer", "operator"):
        answer = await site.client.get("/admin/mcp", headers=site.as_(role))
        assert answer.status_code == 403 and "it needs the admin role" in answer.text
    page = await site.page("/admin/mcp")
    assert 'href="/admin/mcp"' in page and 'href="/admin/guard"' in page
    own = row(page, "mcp-llmgw-admin")
    assert own.startswith("llmgw:admin llmgw's own tools, answered by the control plane on")
    assert "in the control plane" in own and " 6 " in own
    assert 'id="remove-llmgw:admin"' not in page
    # How a person's agent reaches /mcp here, with a key of their own.
    assert '"url": "http://cp/mcp"' in html.unescape(page)
    assert "--tools SERVER.*" in page


async def test_adding_a_server_keeps_its_token_sealed_and_shows_who_is_granted(
    site: Site,
) -> None:
    answer = await site.post(
        "/admin/mcp/servers",
        "admin",
        name="tickets",
        url="http://127.0.0.1:9/mcp",
        bearer=BEARER,
        headers="X-Org=acme",
        rate="5",
        timeout="10",
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/admin/mcp#mcp-tickets"
    key = await site.api("POST", "/api/v1/keys", {"name": "ci"})
    assert isinstance(key, dict)
    await site.api("POST", f"/api/v1/keys/{key['id']}/limits", {"tools": ["tickets.*"]})
    page = await site.page("/admin/mcp")
    tickets = row(page, "mcp-tickets")
    assert "http://127.0.0.1:9/mcp" in tickets
    assert "X-Org Authorization sealed" in tickets
    assert "5/min per caller 10.0 s not listed yet" in tickets
    assert "key ci: tickets.*" in tickets
    assert "no one" in row(page, "mcp-llmgw-admin")
    # The token is in no page and no audit entry.
    assert BEARER not in page
    audit = await site.client.get("/admin/audit", headers=site.as_("admin"))
    assert "mcp.add" in audit.text and BEARER not in audit.text
    assert all(BEARER not in str(e) for e in await site.cp.store.audit_log(100))


async def test_a_credential_in_the_address_is_refused_naming_where_it_belongs(
    site: Site,
) -> None:
    answer = await site.post(
        "/admin/mcp/servers", "admin", name="leaky", url="http://u:pw@127.0.0.1:9/mcp"
    )
    assert answer.status_code == 400
    assert "--bearer-file or --secret-file" in html.unescape(answer.text)
    assert "pw@" not in answer.text
    assert 'id="mcp-leaky"' not in await site.page("/admin/mcp")


async def test_test_off_on_and_remove(site: Site) -> None:
    answer = await site.post("/admin/mcp/servers/llmgw:admin/test", "admin")
    assert answer.status_code == 200
    tested = text(answer.text)
    assert re.search(r"Test of llmgw:admin Answered in [\d.]+ ms with 6 tools", tested)
    assert "llmgw:admin.list_nodes" in tested and "llmgw:admin.node_logs" in tested
    answer = await site.post("/admin/mcp/servers/llmgw:admin/off", "admin")
    assert answer.status_code == 303
    page = await site.page("/admin/mcp")
    assert 'class="state-off"' in page and 'id="on-llmgw-admin"' in page
    await site.post("/admin/mcp/servers/llmgw:admin/on", "admin")
    assert 'id="off-llmgw-admin"' in await site.page("/admin/mcp")
    await site.post("/admin/mcp/servers", "admin", name="gone", url="http://127.0.0.1:9/mcp")
    assert 'id="mcp-gone"' in await site.page("/admin/mcp")
    answer = await site.post("/admin/mcp/servers/gone/remove", "admin")
    assert answer.status_code == 303
    assert 'id="mcp-gone"' not in await site.page("/admin/mcp")
    # The built-in one stays: the service's refusal is shown.
    answer = await site.post("/admin/mcp/servers/llmgw:admin/remove", "admin")
    assert answer.status_code == 409 and "ctl mcp off llmgw:admin" in answer.text


async def test_a_form_without_its_token_changes_nothing(site: Site) -> None:
    headers = site.as_("admin")
    answer = await site.client.post(
        "/admin/mcp/servers/llmgw:admin/off", data={"csrf": "old"}, headers=headers
    )
    assert answer.status_code == 403
    assert site.cp.mcp.registry.servers["llmgw:admin"].enabled


async def test_the_mcp_page_speaks_turkish(site: Site) -> None:
    headers = {**site.as_("admin"), "accept-language": "tr-TR,tr;q=0.9"}
    mcp = html.unescape((await site.client.get("/admin/mcp", headers=headers)).text)
    assert "MCP araç sunucuları" in mcp and "Bir ajanı /mcp'ye yöneltin" in mcp
