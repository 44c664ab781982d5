"""SCIM provisioning against real control planes on loopback.

scim2-tester (the python-scim project's conformance checker) runs every check it has
against ``/scim/v2`` of a real control plane with the token ``llmgw ctl auth scim
token`` printed: each passes but those docs/api.md lists with why they do not apply.

A person deactivated through SCIM on the leader has their personal token refused by the
leader at once and by a standby (following the leader's SQLite store by its changes)
within 2 s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from scim2_client.engines.httpx2 import SyncSCIMClient
from scim2_tester import Status, check_server

from llmgw.server.datadir import DataDir
from llmgw.server.people.asks import NewPerson, NewToken
from llmgw.server.people.directory import Directory
from llmgw.server.people.service import PeopleService
from llmgw.server.principal import Principal
from llmgw.server.store import open_store
from tests.e2e.cluster import Cluster, run
from tests.e2e.standbys import standby_of
from tests.e2e.test_sessions_ha import WITHIN, until_refused

pytestmark = pytest.mark.e2e

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
# The checks that do not pass, each with its line in docs/api.md: (resource type, check,
# what the reason names).
NOT_APPLYING = {("User", "check_remove_attribute", "'active'")}
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


def scim_token(cluster: Cluster) -> str:
    out = run("ctl", "auth", "scim", "token", "--json", "--data-dir", str(cluster.data_dir))
    token: str = json.loads(out.stdout)["token"]
    return token


def test_scim2_tester_finds_every_check_passing_but_those_the_docs_explain(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path)
    cluster.init()
    cluster.start_server()
    try:
        token = scim_token(cluster)
        with httpx2.Client(
            base_url=f"http://{cluster.listen}/scim/v2",
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        ) as http:
            results = check_server(SyncSCIMClient(http))
        log = cluster.server.text() if cluster.server else ""
    finally:
        cluster.stop()
    failed = {
        (
            r.resource_type,
            r.title,
            next((n for _, _, n in NOT_APPLYING if n in (r.reason or "")), r.reason),
        )
        for r in results
        if r.status != Status.SUCCESS
    }
    assert failed == NOT_APPLYING, [r for r in results if r.status != Status.SUCCESS]
    # Users and groups, made, read, listed, searched, replaced, patched and deleted.
    passed = {(r.resource_type, r.title) for r in results if r.status == Status.SUCCESS}
    for kind in ("User", "Group"):
        for check in (
            "object_creation",
            "object_query_without_id",
            "search_with_attributes",
            "object_replacement",
            "object_deletion",
            "check_add_attribute",
            "check_replace_attribute",
        ):
            assert (kind, check) in passed, (kind, check)
    assert len(results) > 60
    docs = DOCS.read_text()
    section = docs[docs.index("## SCIM") :]
    for _, check, named in NOT_APPLYING:
        assert f"`{check}`" in section and named.strip("'") in section
    assert token not in log and "Traceback" not in log


async def _person_with_a_token(root: Path) -> tuple[str, str]:
    """A person made in the leader's store before it starts, and their personal token
    (made as they would, signed in)."""
    data = DataDir(root)
    store = await open_store(data.load_config(), root)
    try:
        directory = Directory(store)
        await directory.load()
        people = PeopleService(directory)
        person = await people.create(NewPerson(login="kim"), Principal.system("test"))
        me = directory.principal(person, "session")
        assert me is not None
        _, token = await people.new_token(person.id, NewToken(name="ctl"), me)
        return person.id, token
    finally:
        await store.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Cluster, Cluster, str, str]]:
    leader = Cluster(tmp_path / "a")
    leader.init()
    person, token = asyncio.run(_person_with_a_token(leader.data_dir))
    leader.start_server()
    standby: Cluster | None = None
    try:
        standby = standby_of(leader, tmp_path / "b")
        yield leader, standby, person, token
    finally:
        if standby is not None:
            standby.stop()
        leader.stop()


def opens(cluster: Cluster, token: str) -> bool:
    answer = httpx.get(
        f"http://{cluster.listen}/api/v1/me", headers={"authorization": f"Bearer {token}"}
    )
    assert answer.status_code in (200, 401), answer.text
    return answer.status_code == 200


def test_a_person_deactivated_through_scim_is_refused_at_once_and_on_a_standby_within_2_s(
    pair: tuple[Cluster, Cluster, str, str],
) -> None:
    leader, standby, person, token = pair
    assert opens(leader, token) and opens(standby, token)
    scim = {"authorization": f"Bearer {scim_token(leader)}"}
    base = f"http://{leader.listen}/scim/v2"
    found = httpx.get(f"{base}/Users", params={"filter": 'userName eq "kim"'}, headers=scim)
    assert [u["id"] for u in found.json()["Resources"]] == [person], found.text

    # On the standby, SCIM reads, and a write names the leader.
    there = httpx.get(f"http://{standby.listen}/scim/v2/Users/{person}", headers=scim)
    assert there.status_code == 200 and there.json()["active"] is True, there.text

    body = {"schemas": [PATCH_OP], "Operations": [{"op": "replace", "value": {"active": False}}]}
    answer = httpx.patch(f"{base}/Users/{person}", json=body, headers=scim)
    said = time.monotonic()
    assert answer.status_code == 200 and answer.json()["active"] is False, answer.text
    assert not opens(leader, token)
    waited = until_refused(lambda: opens(standby, token), "kim's token on cp-b", said)
    assert waited < WITHIN
    written = httpx.patch(
        f"http://{standby.listen}/scim/v2/Users/{person}", json=body, headers=scim
    )
    assert written.status_code == 503 and leader.listen in written.text, written.text
