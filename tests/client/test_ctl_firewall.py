"""``llmgw ctl firewall [set|unset|history]``: what each asks the admin API and what it
prints; against a stand-in client."""

from __future__ import annotations

import json

import pytest

from llmgw.cli import main
from tests.support.fakeadmin import FakeAdmin, install

DOC = {
    "version": 2,
    "enabled": False,
    "networks": ["10.0.0.0/8", "fd00::/8"],
    "source": {"enabled": "ctl", "networks": "server.yaml"},
}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_firewall_shows_each_part_and_where_it_was_set(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/firewall", DOC)
    assert main(["ctl", "firewall"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["FIREWALL", "VALUE", "FROM"]
    assert lines[1].split() == ["enabled", "no", "ctl"]
    assert lines[2].split() == ["networks", "10.0.0.0/8,", "fd00::/8", "server.yaml"]
    assert main(["ctl", "firewall", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == DOC


@pytest.mark.parametrize(
    ("args", "body"),
    [
        (["--off"], {"unset": False, "enabled": False}),
        (
            ["--on", "--network", "10.0.0.0/8"],
            {"unset": False, "enabled": True, "networks": ["10.0.0.0/8"]},
        ),
        (["--any-network"], {"unset": False, "networks": []}),
    ],
)
def test_set_sends_what_was_given(
    admin: FakeAdmin, args: list[str], body: dict[str, object]
) -> None:
    admin.answer("POST", "/api/v1/firewall", DOC)
    assert main(["ctl", "firewall", "set", *args, "--json"]) == 0
    assert admin.asked == [("POST", "/api/v1/firewall", body)]


def test_set_with_nothing_to_change_is_refused_before_anything_is_sent(admin: FakeAdmin) -> None:
    with pytest.raises(SystemExit, match="--on, --off, --network CIDR or --any-network"):
        main(["ctl", "firewall", "set"])
    with pytest.raises(SystemExit, match="one or the other"):
        main(["ctl", "firewall", "set", "--network", "10.0.0.0/8", "--any-network"])
    assert admin.asked == []


def test_unset_and_history(admin: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    admin.answer("POST", "/api/v1/firewall", DOC)
    assert main(["ctl", "firewall", "unset"]) == 0
    assert admin.asked[-1] == ("POST", "/api/v1/firewall", {"unset": True})
    capsys.readouterr()
    change = {
        "at": 1715000000.0,
        "actor": "admin@cp1",
        "action": "firewall.set",
        "change": "enabled = false",
    }
    admin.answer("GET", "/api/v1/firewall/history", [change])
    assert main(["ctl", "firewall", "history"]) == 0
    out = capsys.readouterr().out
    assert "admin@cp1" in out and "enabled = false" in out
    admin.answer("GET", "/api/v1/firewall/history", [])
    assert main(["ctl", "firewall", "history"]) == 0
    assert capsys.readouterr().out == "The firewall has not been changed yet.\n"
