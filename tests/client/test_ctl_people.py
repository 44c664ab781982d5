"""``llmgw ctl people``, ``ctl tokens`` and ``ctl audit`` against a real control plane's
admin API over HTTP (``tests/support/adminserver.py``): what each prints, its ``--json``,
and the control plane's refusals in its own words, for the admin token and for people
signed in with their personal tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import main
from llmgw.client.ctl_people import parse_since
from tests.support.adminserver import Served, serving


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path / "data") as served:
        yield served


class Ctl:
    def __init__(self, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
        self.served = served
        self.capsys = capsys

    def __call__(self, *argv: str, token: str | None = None) -> tuple[int, str, str]:
        """``llmgw ctl ARGV``, as the admin token's holder or with ``token``."""
        self.capsys.readouterr()
        given = ["--server", self.served.base, "--token", token or self.served.token]
        code = main(["ctl", *argv, *given])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str, token: str | None = None) -> Any:
        code, out, err = self(*argv, "--json", token=token)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def ctl(cp: Served, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(cp, capsys)


def test_people_are_made_listed_changed_and_deactivated(ctl: Ctl) -> None:
    code, out, _ = ctl("people", "create", "--login", "ann", "--name", "Ann A", "--role", "viewer")
    assert code == 0 and "login:    ann" in out and "viewer (set by hand)" in out
    made = ctl.json("people", "create", "--login", "bob", "--email", "bob@example.com")
    assert made["login"] == "bob" and made["role"] is None and made["active"] is True

    code, out, _ = ctl("people", "list")
    head, *rows = out.splitlines()
    assert head.split()[:4] == ["LOGIN", "NAME", "EMAIL", "ROLE"]
    assert [r.split()[0] for r in rows] == ["ann", "bob"]
    assert ctl.json("people", "show", "bob")["email"] == "bob@example.com"

    changed = ctl.json("people", "update", "bob", "--role", "operator", "--name", "Bob B")
    assert (changed["role"], changed["name"], changed["role_by_hand"]) == (
        "operator",
        "Bob B",
        True,
    )
    assert ctl.json("people", "update", "bob", "--no-role")["role"] is None

    code, out, _ = ctl("people", "deactivate", "bob")
    assert code == 0 and out.strip() == "bob is deactivated: their sessions and tokens have ended"
    assert ctl.json("people", "show", "bob")["active"] is False
    assert ctl.json("people", "activate", "bob")["active"] is True


def test_refusals_and_bad_input_are_said_and_exit_1(ctl: Ctl) -> None:
    viewer = ctl.served.person("vic", "viewer")
    code, out, err = ctl("people", "create", "--login", "eve", token=viewer)
    assert code == 1 and out == ""
    assert "making people needs the cluster's admin role" in err
    code, _, err = ctl("people", "show", "nobody")
    assert code == 1 and "no such person; see `llmgw ctl people list`" in err
    code, _, err = ctl("people", "update", "vic")
    assert code == 1 and "say what changes: --name, --email, --role or --no-role" in err
    with pytest.raises(SystemExit):  # argparse: one of the two, not both
        ctl("people", "update", "vic", "--role", "admin", "--no-role")


def test_a_person_makes_lists_and_revokes_their_own_tokens(ctl: Ctl) -> None:
    token = ctl.served.person("ann")
    code, out, _ = ctl("tokens", "create", "--name", "laptop", "--days", "7", token=token)
    made, blank, note = out.splitlines()
    assert code == 0 and made.startswith("llmgw-pat-") and blank == ""
    assert "shown this once" in note
    listed = ctl.json("tokens", "list", token=token)
    assert sorted(t["name"] for t in listed) == ["laptop", "test"]
    laptop = next(t for t in listed if t["name"] == "laptop")
    assert laptop["expires_at"] == pytest.approx(laptop["created_at"] + 7 * 86400)
    # The new token acts as her.
    assert ctl.json("tokens", "list", token=made) == listed

    code, out, _ = ctl("tokens", "revoke", laptop["id"], token=token)
    assert code == 0 and out.strip() == f"token {laptop['id']} (laptop) is revoked"
    code, _, err = ctl("tokens", "list", token=made)
    assert code == 1 and "missing or wrong token" in err


def test_an_admin_lists_and_revokes_anothers_tokens_but_makes_none_for_them(ctl: Ctl) -> None:
    token = ctl.served.person("ann")
    (theirs,) = ctl.json("tokens", "list", "--person", "ann")
    assert ctl.json("tokens", "revoke", theirs["id"], "--person", "ann")["revoked_at"]
    code, _, err = ctl("tokens", "list", token=token)
    assert code == 1 and "missing or wrong token" in err
    # The admin token is nobody's: ctl says so, rather than guessing a person.
    code, _, err = ctl("tokens", "create", "--name", "x")
    assert code == 1 and "is not a person (the admin token): name one with --person" in err
    other = ctl.served.person("bob")
    code, _, err = ctl("tokens", "list", "--person", "ann", token=other)
    assert code == 1 and "only the person themselves or a cluster admin" in err


def test_audit_names_who_did_what_filtered_by_org_person_and_time(ctl: Ctl) -> None:
    start = time.time()
    ann = ctl.served.person("ann")
    ctl("orgs", "create", "vision")
    ctl("members", "set", "ann", "--org", "vision", "--role", "admin")
    ctl("teams", "create", "cv", "--org", "vision")
    ctl("projects", "create", "demo", "--org", "vision", "--team", "cv")
    code, out, _ = ctl("audit")
    assert code == 0 and out.splitlines()[0].split() == [
        "AT",
        "ACTOR",
        "ACTION",
        "TARGET",
        "ORG",
        "DETAIL",
    ]
    everything = ctl.json("audit")
    actions = [e["action"] for e in everything]
    assert actions[:4] == ["project.create", "team.create", "member.set", "org.create"]
    assert {e["actor"] for e in everything[:4]} == {"admin@127.0.0.1"}

    vision = ctl.json("orgs", "show", "vision")["id"]
    in_vision = ctl.json("audit", "--org", "vision")
    assert [e["action"] for e in in_vision] == actions[:4]
    assert {e["org_id"] for e in in_vision} == {vision}
    # She was made by the test's own principal; her token, by her.
    assert [e["action"] for e in ctl.json("audit", "--person", "ann")] == ["token.create"]
    assert [e["action"] for e in ctl.json("audit", "--person", "admin@127.0.0.1")][:1] == [
        "project.create"
    ]
    assert ctl.json("audit", "--since", "2d", "--limit", "2") == everything[:2]
    later = ctl.json("audit", "--since", "2099-01-01")
    assert later == [] and all(e["at"] >= start - 1 for e in everything[:4])

    # An admin of the organisation reads its audit, and names it; nothing else.
    assert ctl.json("audit", "--org", "vision", token=ann) == in_vision
    code, _, err = ctl("audit", token=ann)
    assert code == 1 and "org: name the organisation whose audit to read" in err
    code, _, err = ctl("audit", "--org", "default", token=ann)
    assert code == 1 and "no such organisation" in err
    # What she does herself is hers in the log, in her organisation's.
    assert ctl("projects", "create", "web", "--org", "vision", "--team", "cv", token=ann)[0] == 0
    mine = ctl.json("audit", "--org", "vision", "--person", "ann", token=ann)
    assert [(e["action"], e["target"]) for e in mine] == [("project.create", "cv/web")]
    code, _, err = ctl("audit", "--person", "nobody")
    assert code == 1 and "no such person" in err


def test_since_reads_dates_times_and_spans() -> None:
    assert parse_since("2026-12-01") == 1796083200.0
    assert parse_since("2026-12-01T01:00") == 1796083200.0 + 3600
    assert parse_since("2026-12-01T01:00+01:00") == 1796083200.0
    assert parse_since("2h", now=10000.0) == 10000.0 - 7200
    assert parse_since("7d", now=1e6) == 1e6 - 7 * 86400
    with pytest.raises(Exception, match="neither a date or time"):
        parse_since("yesterday")
