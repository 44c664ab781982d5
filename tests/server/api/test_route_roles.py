"""Who may call each admin route, against the table in docs/api.md ("Who may call
what"): the table lists exactly the routes the real admin app serves, each with the
least role its ``Op`` declares, and every route is called as nobody, as people (with
personal tokens made through ``PeopleService``) without a cluster role and with each
role, and with the admin token. A caller short of the route's role is refused at the
gate (401 with no caller, 403 naming the role); one that reaches it is never refused
there, and for a route that needs a cluster role never refused at all."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from llmgw.server.access import ACCESS, Access
from llmgw.server.api import Op
from llmgw.server.app import ControlPlane
from llmgw.server.principal import Role
from tests.support.people import person_with_token

DOCS = Path(__file__).resolve().parents[3] / "docs" / "api.md"
ROW = re.compile(r"^\| (GET|POST|DELETE|PUT|PATCH) \| `([^`]+)` \| (\w+) \|(.*)\|$")


def documented() -> dict[tuple[str, str], tuple[str, str]]:
    """The table of docs/api.md's "Who may call what": (method, path) -> (needs, what
    the service checks)."""
    text = DOCS.read_text()
    start = text.index("\n## Who may call what\n")
    end = text.index("\n### ", start)
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    for line in text[start:end].splitlines():
        found = ROW.match(line)
        if found:
            method, path, needs, checks = found.groups()
            assert (method, path) not in rows, f"{method} {path} is in the table twice"
            rows[(method, path)] = (needs, checks.strip())
    return rows


# Each caller's reach, written out here rather than asked of the gate it checks.
RANK = {"viewer": 1, "operator": 2, "admin": 3}


def reaches(role: str | None, signed_in: bool, needs: Access) -> bool:
    if needs == "public":
        return True
    if needs == "member":
        return signed_in
    if needs == "metrics":
        return role is not None
    return role is not None and RANK[role] >= RANK[needs]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def refused_at_the_gate(answer: httpx.Response, needs: Access) -> bool:
    """The gate's own refusal: a 401, or the 403 naming the role the route needs."""
    if answer.status_code == 401:
        return True
    message = answer.json()["error"]["message"] if answer.status_code == 403 else ""
    return f"it needs the {needs} role" in message


async def test_the_docs_table_lists_every_route_with_the_role_it_needs(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, _ = plane
    served = {(op.method, op.path): op.needs for op in cp.routes()}
    table = documented()
    assert set(table) - set(served) == set(), "routes in docs/api.md the app does not serve"
    assert set(served) - set(table) == set(), "routes the app serves that docs/api.md lacks"
    wrong = {k: (table[k][0], v) for k, v in served.items() if table[k][0] != v}
    assert wrong == {}, "docs/api.md (left) and the route's Op.needs (right) differ"
    # A member route says what its service checks; no other route needs to.
    unsaid = [k for k, (needs, checks) in table.items() if needs == "member" and not checks]
    assert unsaid == []
    assert {needs for needs, _ in table.values()} == set(ACCESS)


async def test_every_route_refuses_each_caller_short_of_its_role_and_no_other(
    plane: tuple[ControlPlane, httpx.AsyncClient], data_dir: tuple[Path, str]
) -> None:
    cp, _ = plane
    _, admin_token = data_dir
    # Each caller's cluster role and token (None: sends none).
    callers: dict[str, tuple[Role | None, str | None]] = {"nobody": (None, None)}
    people: tuple[tuple[str, Role | None], ...] = (
        ("plain", None),
        ("vic", "viewer"),
        ("olga", "operator"),
        ("ada", "admin"),
    )
    for login, role in people:
        _, token = await person_with_token(cp, login, role)
        who = cp.directory.by_token(token)
        assert who is not None and (who.name, who.role) == (login, role)
        callers[login] = (role, token)
    callers["admin token"] = ("admin", admin_token)
    # The cluster's metrics token: no role, and signed in to nothing but metrics.
    callers["metrics token"] = (None, cp.metrics_token)
    ops = cp.routes()
    assert len(ops) >= 90  # the whole admin API, not a handful
    seen_refused: set[str] = set()
    seen_reached: set[str] = set()
    # A client of its own: the fixture's sends the admin token with every request.
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        for op in ops:
            await walk(client, op, callers, seen_refused, seen_reached)
    assert seen_reached == set(callers)
    assert seen_refused == set(callers) - {"ada", "admin token"}


async def walk(
    client: httpx.AsyncClient,
    op: Op[Any, Any],
    callers: dict[str, tuple[Role | None, str | None]],
    seen_refused: set[str],
    seen_reached: set[str],
) -> None:
    """One route, called as each caller in turn."""
    for name, (role, token) in callers.items():
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        # A body that is refused once read: a route reached changes nothing with it.
        answer = await client.request(
            op.method, concrete(op.path), headers=headers, content=b"{not json"
        )
        where = f"{op.method} {op.path} as {name}: {answer.status_code} {answer.text[:200]}"
        if name == "metrics token":
            reached = op.needs in ("public", "metrics")
        else:
            reached = reaches(role, token is not None, op.needs)
        if reached:
            seen_reached.add(name)
            assert not refused_at_the_gate(answer, op.needs), where
            if op.needs != "member":
                assert answer.status_code not in (401, 403), where
            assert answer.status_code < 500, where
        else:
            seen_refused.add(name)
            assert answer.status_code == (401 if token is None else 403), where
            assert refused_at_the_gate(answer, op.needs), where
        if op.path == "/api/v1/admin-token/rotate" and answer.status_code == 200:
            # Rotated: the admin token's caller goes on with the new one.
            callers["admin token"] = (callers["admin token"][0], answer.json()["token"])
