"""``POST /api/v1/admin-token/rotate`` on a real control plane's admin app: the new token
answered once; the old one refused at once by the API and the pages; the data dir's
admin.token rewritten; a standby answers 409 not_leader and changes nothing."""

from __future__ import annotations

from pathlib import Path

import httpx

from llmgw import pki
from llmgw.server.app import ControlPlane
from llmgw.server.sessions import COOKIE

ROTATE = "/api/v1/admin-token/rotate"


async def test_the_new_token_is_answered_once_and_the_old_one_ends_at_once(
    plane: tuple[ControlPlane, httpx.AsyncClient], data_dir: tuple[Path, str]
) -> None:
    cp, client = plane
    root, old = data_dir
    session = cp.sessions.open("admin@127.0.0.1", "admin", pki.token_hash(old))
    pages = {"cookie": f"{COOKIE}={session}"}
    assert (await client.get("/admin", headers=pages)).status_code == 200

    answer = await client.post(ROTATE)
    assert answer.status_code == 200, answer.text
    new = answer.json()["token"]
    assert answer.json() == {"token": new, "token_file": str(root / "admin.token")}
    assert new.startswith("llmgw-admin-") and new != old
    assert (root / "admin.token").read_text() == new + "\n"

    # The old token: refused by the API, and the session opened with it has ended.
    refused = await client.get("/api/v1/keys")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "unauthorized"
    signed_out = await client.get("/admin", headers=pages)
    assert signed_out.status_code == 303 and "/admin/login" in signed_out.headers["location"]
    # The new one opens the API; nothing shows it again.
    bearer = {"authorization": f"Bearer {new}"}
    assert (await client.get("/api/v1/keys", headers=bearer)).status_code == 200
    trail = (await cp.store.audit_log())[0]
    assert trail["action"] == "admin_token.rotate" and trail["actor"] == "admin@127.0.0.1"
    assert new not in str(trail) and pki.token_hash(new) not in str(trail)


async def test_a_standby_answers_not_leader_and_keeps_the_token(
    plane: tuple[ControlPlane, httpx.AsyncClient], data_dir: tuple[Path, str]
) -> None:
    cp, client = plane
    root, old = data_dir
    cp.ha.role = "standby"
    answer = await client.post(ROTATE)
    assert answer.status_code == 409 and answer.json()["error"]["type"] == "not_leader"
    assert cp.admin_tokens.ok(old) and (root / "admin.token").read_text() == old + "\n"
    assert (await client.get("/api/v1/keys")).status_code == 200


async def test_without_the_admin_token_nothing_is_rotated(
    plane: tuple[ControlPlane, httpx.AsyncClient], data_dir: tuple[Path, str]
) -> None:
    cp, client = plane
    _, old = data_dir
    answer = await client.post(ROTATE, headers={"authorization": "Bearer llmgw-admin-guess"})
    assert answer.status_code == 401
    assert cp.admin_tokens.ok(old)
