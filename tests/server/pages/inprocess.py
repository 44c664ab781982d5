"""A real control plane's admin pages called in process over its SQLite store, through
the pages' own steps (session, role, CSRF, headers): ``Site`` signs in as a role and
posts forms with their CSRF token, and reads the admin API with the admin token."""

from __future__ import annotations

import html
import re

import httpx

from llmgw import pki
from llmgw.server.app import ControlPlane
from llmgw.server.sessions import COOKIE


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


def text(page: str) -> str:
    words = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return re.sub(r" ([,:;)])", r"\1", words)


def row(page: str, id_: str) -> str:
    found = re.search(rf'<tr id="{id_}"[^>]*>(.*?)</tr>', page, re.S)
    assert found is not None, id_
    return text(found.group(1)).strip()
