"""``gateway/grants.py``: what a limits ask makes of a level's limits, what a revoke
reaches beneath a team or a project (and what it leaves alone), and the grants listing."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.server.gateway.grants import asked, grant_rows, policy_names, revocations
from llmgw.server.people.asks import SetLimits
from llmgw.server.people.directory import Snapshot
from llmgw.server.people.records import Limits, Org, Project, Team
from llmgw.server.refusal import Refusal
from llmgw.server.store import ApiKeyRecord, SQLiteStore

ORG = Org("o1", "acme", Limits(tools=("jira.*", "wiki.*")))
CV = Team("t1", "o1", "cv", Limits(tools=("jira.*",)))
NLP = Team("t2", "o1", "nlp", Limits(tools=("jira.get",)))
DEMO = Project("j1", "o1", "t1", "demo", Limits(tools=("jira.get", "wiki.get")))
CHAT = Project("j2", "o1", "t2", "chat", Limits(tools=("jira.get",)))
TREE = Snapshot(orgs={"o1": ORG}, teams={"t1": CV, "t2": NLP}, projects={"j1": DEMO, "j2": CHAT})


def key(kid: str, project: str | None, tools: tuple[str, ...] | None, **kw: object) -> ApiKeyRecord:
    return ApiKeyRecord(
        kid, kid, f"sha256:{kid}", org_id="o1", project_id=project, tools=tools, **kw
    )  # type: ignore[arg-type]


KEYS = [
    key("demo-key", "j1", ("jira.*",)),
    key("chat-key", "j2", ("jira.*",)),
    key("silent", "j1", None),
    key("gone", "j1", ("jira.*",), revoked_at=5.0),
    key("personal", None, ("jira.*",), person_id="p1"),
]


def test_a_revoke_at_a_team_reaches_its_projects_and_their_keys_only() -> None:
    changed = revocations(CV, "jira", TREE, KEYS)
    assert [(type(c).__name__, c.id) for c in changed] == [
        ("Project", "j1"),
        ("ApiKeyRecord", "demo-key"),
    ]
    project, demo_key = changed
    assert isinstance(project, Project) and project.limits.tools == ("wiki.get",)
    assert isinstance(demo_key, ApiKeyRecord) and demo_key.tools == ()
    # The other team's project and key, a key saying nothing, a revoked key: untouched.


def test_a_revoke_at_an_organisation_reaches_personal_keys_too() -> None:
    ids = [c.id for c in revocations(ORG, "jira", TREE, KEYS)]
    assert ids == ["t1", "t2", "j1", "j2", "demo-key", "chat-key", "personal"]
    assert [c.id for c in revocations(DEMO, "jira", TREE, KEYS)] == ["demo-key"]
    assert revocations(ORG, "slack", TREE, KEYS) == []


def test_an_ask_keeps_what_it_leaves_out_and_clears_what_it_names() -> None:
    old = Limits(rpm=5, models=("q*",), tools=("jira.*",), guard=("pii",))
    assert asked(old, SetLimits(tpm=7), frozenset()) == Limits(
        5, 7, None, ("q*",), ("jira.*",), ("pii",)
    )
    assert asked(old, SetLimits(tools=()), frozenset()).tools == ()
    cleared = asked(old, SetLimits(clear=("tools", "guard", "rpm")), frozenset())
    assert (cleared.tools, cleared.guard, cleared.rpm) == (None, (), None)
    with pytest.raises(Refusal) as bad:
        asked(old, SetLimits(clear=("speed",)), frozenset())
    assert bad.value.field == "clear" and "'speed'" in bad.value.message
    with pytest.raises(Refusal) as bad:
        asked(old, SetLimits(tools=("jira.ok", "/etc.passwd")), frozenset())
    assert bad.value.field == "tools" and "'/etc.passwd'" in bad.value.message
    with pytest.raises(Refusal) as bad:
        asked(old, SetLimits(guard=("pii", "secrets")), frozenset({"pii"}))
    assert "'secrets'" in bad.value.message and "ctl guard policy list" in bad.value.message


def test_the_listing_filters_by_server_and_keeps_closed_lists() -> None:
    closed = Snapshot(orgs={"o1": ORG}, teams={"t1": Team("t1", "o1", "cv", Limits(tools=()))})
    rows = grant_rows(closed, KEYS, "wiki")
    assert [(r["label"], r["patterns"], r["closed"]) for r in rows] == [
        ("organisation acme", ["wiki.*"], False),
        ("team cv", [], True),
    ]
    every = grant_rows(TREE, KEYS)
    assert [r["id"] for r in every] == [
        "o1",
        "t1",
        "t2",
        "j1",
        "j2",
        "chat-key",  # keys in the order they were made (here all at once: by id)
        "demo-key",
        "personal",
    ]
    assert next(r for r in every if r["id"] == "j1")["label"] == "project cv/demo"


async def test_policy_names_are_read_from_the_guards_document(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    try:
        assert await policy_names(store) == frozenset()
        await store.put_setting("guard", '{"policies": [{"name": "pii"}, {"name": "inj"}]}')
        assert await policy_names(store) == {"pii", "inj"}
        await store.put_setting("guard", "not json")
        assert await policy_names(store) == frozenset()
    finally:
        await store.close()
