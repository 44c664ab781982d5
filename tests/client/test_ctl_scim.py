"""``llmgw ctl auth scim [show|token|off|map]``: what each asks the admin API, what it
prints (the token once, with where the provider sends it; the settings as a table, or
the API's JSON with --json), and a refusal's words; against a stand-in client."""

from __future__ import annotations

import json

import pytest

from llmgw.cli import main
from llmgw.client.adminbase import AdminError
from tests.support.fakeadmin import FakeAdmin, install

SETTINGS = "/api/v1/auth/scim"
ON = {
    "token": "set",
    "token_made_at": 1_796_000_000.0,
    "endpoint": "/scim/v2",
    "maps": ["eng=acme/ml:manager", "ops=cluster:operator"],
    "users": 12,
    "groups": 3,
}
OFF = {**ON, "token": None, "token_made_at": None, "maps": []}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_show_says_on_or_off_the_endpoint_and_every_map(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", SETTINGS, ON)
    assert main(["ctl", "auth", "scim"]) == 0
    out = capsys.readouterr().out
    assert "on (token made 2026-" in out and "/scim/v2" in out
    assert "eng=acme/ml:manager" in out and "ops=cluster:operator" in out
    admin.answer("GET", SETTINGS, OFF)
    assert main(["ctl", "auth", "scim", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == OFF
    admin.answer("GET", SETTINGS, OFF)
    assert main(["ctl", "auth", "scim", "show"]) == 0
    assert "none: groups give nothing" in capsys.readouterr().out


def test_the_token_comes_first_alone_then_where_to_send_it(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("POST", SETTINGS + "/token", {"token": "llmgw-scim-x", "endpoint": "/scim/v2"})
    assert main(["ctl", "auth", "scim", "token"]) == 0
    token, blank, *note = capsys.readouterr().out.splitlines()
    assert (token, blank) == ("llmgw-scim-x", "")
    assert "http://cp/scim/v2" in " ".join(note) and "no longer works" in " ".join(note)
    assert admin.asked == [("POST", SETTINGS + "/token", {})]


def test_map_sends_every_map_at_once_and_clear_sends_none(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("POST", SETTINGS + "/maps", ON)
    assert main(["ctl", "auth", "scim", "map", "eng=acme/ml:manager", "ops=cluster:operator"]) == 0
    assert admin.asked[-1] == (
        "POST",
        SETTINGS + "/maps",
        {"maps": ["eng=acme/ml:manager", "ops=cluster:operator"]},
    )
    assert main(["ctl", "auth", "scim", "map", "--clear"]) == 0
    assert admin.asked[-1] == ("POST", SETTINGS + "/maps", {"maps": []})
    with pytest.raises(SystemExit, match="--clear"):
        main(["ctl", "auth", "scim", "map"])
    capsys.readouterr()


def test_off_and_a_refusal(admin: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    admin.answer("DELETE", SETTINGS, OFF)
    assert main(["ctl", "auth", "scim", "off"]) == 0
    assert "off" in capsys.readouterr().out
    refused = AdminError(f"http://cp{SETTINGS}/maps: maps: 'x' is not GROUP=ORG[/TEAM]:ROLE")
    admin.answer("POST", SETTINGS + "/maps", refused)
    assert main(["ctl", "auth", "scim", "map", "x"]) == 1
    assert "is not GROUP=ORG[/TEAM]:ROLE" in capsys.readouterr().err
