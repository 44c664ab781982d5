"""``llmgw ctl orgs|teams|projects|members|limits`` and ``ctl keys create --org
--project --personal`` against a real control plane's admin API over HTTP
(``tests/support/adminserver.py``): the cluster's admin builds an organisation, an
organisation's admin runs it, and what stays with the cluster's staff is refused in the
control plane's words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.test_ctl_people import Ctl
from tests.support.adminserver import serving


@pytest.fixture
def ctl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Ctl]:
    with serving(tmp_path / "data") as served:
        yield Ctl(served, capsys)


def test_an_organisation_its_teams_and_projects(ctl: Ctl) -> None:
    made = ctl.json("orgs", "create", "vision")
    assert made["name"] == "vision" and made["limits"]["rpm"] is None
    code, out, _ = ctl("orgs", "list")
    assert code == 0 and [r.split()[0] for r in out.splitlines()[1:]] == ["default", "vision"]
    assert ctl.json("orgs", "rename", "vision", "sight")["id"] == made["id"]
    code, out, _ = ctl("orgs", "show", made["id"])
    assert out.splitlines() == [
        f"sight (id {made['id']})",
        "limits: rpm -, tpm -, budget -, models all, tools none, guard none",
    ]

    ctl("teams", "create", "cv", "--org", "sight")
    ctl("teams", "create", "nlp", "--org", "sight")
    assert [t["name"] for t in ctl.json("teams", "list", "--org", "sight")] == ["cv", "nlp"]
    ctl("projects", "create", "demo", "--org", "sight", "--team", "cv")
    ctl("projects", "create", "demo", "--org", "sight", "--team", "nlp")
    code, out, _ = ctl("projects", "list", "--org", "sight")
    assert sorted(r.split()[:2] for r in out.splitlines()[1:]) == [["cv", "demo"], ["nlp", "demo"]]
    (nlp_demo,) = ctl.json("projects", "list", "--org", "sight", "--team", "nlp")
    assert nlp_demo["team"] == "nlp"

    # A name two teams share is named with its team, as --team or TEAM/NAME.
    code, out, _ = ctl("projects", "remove", "demo", "--org", "sight", "--team", "nlp")
    assert code == 0 and out.strip() == "project nlp/demo is removed"
    code, out, _ = ctl("projects", "remove", "cv/demo", "--org", "sight")
    assert code == 0 and out.strip() == "project cv/demo is removed"
    code, _, err = ctl("projects", "remove", "cv/demo", "--org", "sight")
    assert code == 1 and "sight has no project 'demo' in team 'cv'" in err

    code, _, err = ctl("orgs", "remove", "sight")
    assert code == 1 and "still has teams or keys" in err
    ctl("teams", "remove", "cv", "--org", "sight")
    ctl("teams", "remove", "nlp", "--org", "sight")
    code, out, _ = ctl("orgs", "remove", "sight")
    assert code == 0 and out.strip() == "sight is removed"
    code, _, err = ctl("teams", "list", "--org", "sight")
    assert code == 1 and "no such organisation" in err


def test_members_of_an_organisation_and_its_teams(ctl: Ctl) -> None:
    ann = ctl.served.person("ann")
    ctl.served.person("bob")
    ctl("orgs", "create", "vision")
    ctl("teams", "create", "cv", "--org", "vision")
    set_ = ctl.json("members", "set", "ann", "--org", "vision", "--role", "admin")
    assert (set_["login"], set_["kind"], set_["role"], set_["by_hand"]) == (
        "ann",
        "org",
        "admin",
        True,
    )
    # The organisation's admin runs it: a member of a team, their role, their removal.
    code, out, _ = ctl("members", "set", "bob", "--org", "vision", "--team", "cv", token=ann)
    assert code == 0 and out.splitlines()[1].split() == [
        "bob",
        "team",
        "cv",
        "member",
        "by",
        "hand",
    ]
    ctl("members", "set", "bob", "--org", "vision", "--team", "cv", "--role", "manager", token=ann)
    listed = ctl.json("members", "list", "--org", "vision", token=ann)
    assert sorted((m["login"], m["kind"], m["role"]) for m in listed) == [
        ("ann", "org", "admin"),
        ("bob", "team", "manager"),
    ]
    only_cv = ctl.json("members", "list", "--org", "vision", "--team", "cv")
    assert [m["login"] for m in only_cv] == ["bob"]
    code, out, _ = ctl("members", "remove", "bob", "--org", "vision", "--team", "cv", token=ann)
    assert code == 0 and out.strip() == "bob is no longer in team cv"
    # Not their own admin role; not the organisation's name.
    code, _, err = ctl("members", "remove", "ann", "--org", "vision", token=ann)
    assert code == 1 and "you cannot take your own admin role away" in err
    code, _, err = ctl("orgs", "rename", "vision", "mine", token=ann)
    assert code == 1 and "an organisation's name stays with the cluster's admins" in err


def test_limits_at_each_level_set_and_cleared(ctl: Ctl) -> None:
    ctl("orgs", "create", "vision")
    ctl("teams", "create", "cv", "--org", "vision")
    ctl("projects", "create", "demo", "--org", "vision", "--team", "cv")
    code, out, _ = ctl("limits", "set", "--org", "vision", "--rpm", "600", "--budget", "1000000")
    assert code == 0 and out.strip() == (
        "organisation vision: rpm 600, tpm -, budget 1000000, models all, tools none, guard none"
    )
    team = ctl.json("limits", "set", "--org", "vision", "--team", "cv", "--tpm", "5000")
    assert team == {
        "rpm": None,
        "tpm": 5000,
        "budget": None,
        "models": [],
        "tools": None,
        "guard": [],
        "revoked": [],
    }
    project = ctl.json(
        "limits", "set", "--org", "vision", "--project", "cv/demo", "--models", "qwen*, llama*"
    )
    assert project["models"] == ["qwen*", "llama*"]
    del project["revoked"]
    assert ctl.json("projects", "list", "--org", "vision")[0]["limits"] == project
    cleared = ctl.json("limits", "set", "--org", "vision", "--clear", "rpm,budget")
    assert cleared == {
        "rpm": None,
        "tpm": None,
        "budget": None,
        "models": [],
        "tools": None,
        "guard": [],
        "revoked": [],
    }

    code, _, err = ctl("limits", "set", "--org", "vision", "--clear", "rpm,speed")
    assert code == 1 and "--clear: speed is not a limit" in err
    code, _, err = ctl("limits", "set", "--org", "vision")
    assert code == 1 and "say what to set" in err
    ctl.served.person("ann")
    ctl("members", "set", "ann", "--org", "vision", "--role", "admin")
    ann = ctl.served.person("bea")
    ctl("members", "set", "bea", "--org", "vision", "--role", "admin")
    code, _, err = ctl("limits", "set", "--org", "vision", "--rpm", "1", token=ann)
    assert code == 1 and "limits stay with the cluster's staff" in err


def test_tools_granted_closed_revoked_and_shown_at_each_level(ctl: Ctl) -> None:
    ctl("orgs", "create", "vision")
    ctl("teams", "create", "cv", "--org", "vision")
    ctl("projects", "create", "demo", "--org", "vision", "--team", "cv")
    key = ctl.json("keys", "create", "--name", "ci", "--org", "vision", "--project", "cv/demo")
    code, out, _ = ctl("limits", "set", "--org", "vision", "--tools", "jira.*,wiki.*")
    assert code == 0 and "tools jira.*,wiki.*" in out
    ctl("limits", "set", "--org", "vision", "--team", "cv", "--tools", "jira.get_*")
    ctl("keys", "limits", key["id"], "--tools", "jira.*")
    code, out, _ = ctl("orgs", "list")
    head, *rows = out.splitlines()
    column = head.split().index("TOOLS")
    assert {r.split()[0]: r.split()[column] for r in rows} == {
        "default": "none",
        "vision": "jira.*,wiki.*",
    }
    # A revoke at the organisation: its own list, the team's and the key's lose jira.
    code, out, _ = ctl("limits", "set", "--org", "vision", "--revoke-tools", "jira")
    assert code == 0, out
    assert out.splitlines() == [
        "organisation vision: rpm -, tpm -, budget -, models all, tools wiki.*, guard none",
        "revoked beneath it:",
        "  team cv: closed: no tool until `--clear tools` opens it",
        "  key ci: closed: no tool until `--clear tools` opens it",
    ]
    grants = ctl.json("keys", "show", key["id"])["tools"]
    assert grants == []
    code, out, _ = ctl("keys", "list")
    head, *rows = out.splitlines()
    (row,) = [r for r in rows if r.split()[0] == key["id"]]
    assert row.split()[head.split().index("TOOLS")] == "closed"
    # --tools '' closes a level; --clear tools opens it (it says nothing again).
    code, out, _ = ctl("limits", "set", "--org", "vision", "--team", "cv", "--clear", "tools")
    assert code == 0 and "tools none" in out
    code, out, _ = ctl("limits", "set", "--org", "vision", "--project", "cv/demo", "--tools", "")
    assert code == 0 and out.splitlines()[-1] == "closed: no tool until `--clear tools` opens it"
    code, _, err = ctl("limits", "set", "--org", "vision", "--tools", "jira")
    assert code == 1 and "'jira' is not a tool pattern" in err
    code, _, err = ctl("limits", "set", "--org", "vision", "--guard", "pii")
    assert code == 1 and "no guard policy 'pii'" in err and "ctl guard policy list" in err


def test_keys_are_made_for_a_project_or_for_oneself(ctl: Ctl) -> None:
    ctl("orgs", "create", "vision")
    ctl("teams", "create", "cv", "--org", "vision")
    ctl("projects", "create", "demo", "--org", "vision", "--team", "cv")
    project = ctl.json("projects", "list", "--org", "vision")[0]
    made = ctl.json("keys", "create", "--name", "web", "--org", "vision", "--project", "cv/demo")
    key = ctl.json("keys", "show", made["id"])
    assert (key["org_id"], key["project_id"]) == (project["org_id"], project["id"])
    # Unnamed, a key goes to the default organisation's default project, as before.
    plain = ctl.json("keys", "show", ctl.json("keys", "create", "--name", "old")["id"])
    assert (plain["org_id"], plain["project_id"]) == ("default", "default")

    ann = ctl.served.person("ann")
    ctl("members", "set", "ann", "--org", "vision")
    mine = ctl.json("keys", "create", "--name", "mine", "--personal", token=ann)
    shown = ctl.json("keys", "show", mine["id"], token=ann)
    assert (shown["org_id"], shown["project_id"]) == (project["org_id"], None)
    code, _, err = ctl("keys", "create", "--name", "x", "--project", "cv/demo", token=ann)
    assert code == 1 and "project: no project 'cv/demo' there" in err  # in the default org
    asked = ("keys", "create", "--name", "x", "--org", "vision", "--project", "cv/demo")
    code, _, err = ctl(*asked, token=ann)
    assert code == 1 and "needs its team's or organisation's manager role" in err
    code, _, err = ctl("keys", "create", "--name", "x", "--personal")
    assert code == 1 and "only a signed-in person has keys of their own" in err
    with pytest.raises(SystemExit):  # a project's or one's own, not both
        ctl("keys", "create", "--name", "x", "--personal", "--project", "cv/demo")
