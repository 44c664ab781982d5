"""Which MCP tools a key may use: the key and every level above it that names a list
must match the tool's SERVER.TOOL name; an empty list closes; nothing named, no tools.
Worked out by the key book from the levels as the directory has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.server.gateway.limits import KeyBook, Usage
from llmgw.server.gateway.toolgrants import ToolGrant, bad_pattern, reaches
from llmgw.server.people.directory import Snapshot
from llmgw.server.people.records import Limits, Org, Project, Team
from llmgw.server.store import ApiKeyRecord, SQLiteStore


def book(key_tools: tuple[str, ...] | None, **levels: Limits) -> KeyBook:
    snapshot = Snapshot(
        orgs={"o1": Org("o1", "acme", levels.get("org", Limits()))},
        teams={"t1": Team("t1", "o1", "vision", levels.get("team", Limits()))},
        projects={"p1": Project("p1", "o1", "t1", "demo", levels.get("project", Limits()))},
    )
    keys = KeyBook(Usage(SQLiteStore(Path("unopened.db"))), tree=lambda: snapshot)
    keys.load(
        [
            ApiKeyRecord(
                "k1", "ci", "h1", org_id="o1", project_id="p1", tools=key_tools, guard=("pii",)
            )
        ]
    )
    return keys


def test_a_tool_is_granted_only_within_every_list_named_above_it() -> None:
    keys = book(("jira.*", "search.web"), org=Limits(tools=("jira.*", "llmgw:admin.*")))
    grant = keys.keys["h1"].tools
    assert grant.allows("jira.create_issue")
    assert not grant.allows("search.web")  # the key names it; its organisation does not
    assert not grant.allows("llmgw:admin.list_nodes")  # the organisation's; not the key's
    assert grant.closed is None


def test_a_key_under_levels_that_say_nothing_of_tools_has_none() -> None:
    grant = book(None).keys["h1"].tools
    assert not grant.any and not grant.allows("jira.create_issue")


def test_an_empty_list_closes_every_key_beneath_and_says_who() -> None:
    keys = book(("jira.*",), team=Limits(tools=()))
    grant = keys.keys["h1"].tools
    assert not grant.allows("jira.create_issue")
    assert grant.closed == "team vision"


def test_guard_policies_come_from_the_key_and_its_levels_each_once() -> None:
    keys = book(None, org=Limits(guard=("pii", "injection")), project=Limits(guard=("pii",)))
    assert keys.keys["h1"].policies == ("pii", "injection")


@pytest.mark.parametrize(
    "pattern", ["jira", "../etc.passwd", "jira.a\x00b", "jira. x", "a..b.c", "", "x." + "y" * 200]
)
def test_a_pattern_that_is_not_server_dot_tool_is_refused_with_the_form(pattern: str) -> None:
    said = bad_pattern(pattern)
    assert said is not None and "SERVER.TOOL" in said


def test_revoking_a_server_reaches_the_patterns_that_could_name_its_tools() -> None:
    assert reaches("jira.*", "jira") and reaches("*.search", "jira")
    assert not reaches("search.web", "jira")
    assert ToolGrant.of([("key k", None)]).lists == ()
