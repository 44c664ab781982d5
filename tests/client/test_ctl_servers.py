"""``llmgw server token|remove|join|promote|add`` and ``llmgw ctl servers``: what each
asks the admin API (path and body) or hands to this machine's data dir, what it prints
(the API's JSON with --json, else words or a table) and its exit status when refused;
against a stand-in client."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import main
from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_servers import servers_table
from tests.support.fakeadmin import FakeAdmin, install

NOW = 1_700_000_000.0


def server(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "cp1",
        "role": "leader",
        "term": 4,
        "answers": True,
        "api_address": "10.0.0.1:8080",
        "agent_address": "10.0.0.1:8443",
        "peer_address": "10.0.0.1:8444",
        "last_contact": NOW - 3,
        "lag_seconds": None,
        "problem": None,
        "joined_at": NOW - 86400,
        "removed_at": None,
        "this": False,
    }
    return {**base, **kw}


SERVERS = [
    server(this=True, last_contact=None),
    server(
        name="cp2",
        role="standby",
        api_address="10.0.0.2:8080",
        agent_address="10.0.0.2:8443",
        peer_address="10.0.0.2:8444",
        lag_seconds=1.26,
    ),
    server(name="cp3", role=None, term=None, last_contact=None, problem="no answer in 2 s"),
    server(name="cp4", role=None, term=None, removed_at=NOW - 60, last_contact=NOW - 4000),
]
TOKEN = {"token": "llmgw-join-abc", "id": "t1", "expires_at": NOW + 3600, "addresses": []}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def _rows(table: str) -> list[dict[str, str]]:
    head, *rows = table.splitlines()
    names = [n for n in head.split("  ") if n]
    starts = [head.index(n) for n in names]
    ends = [*starts[1:], None]
    return [
        {n.strip(): r[s:e].strip() for n, s, e in zip(names, starts, ends, strict=True)}
        for r in rows
    ]


def test_the_table_says_each_control_planes_role_term_and_lag() -> None:
    table = servers_table(SERVERS, now=NOW)  # type: ignore[arg-type]
    *body, footnote = table.splitlines()
    assert footnote == "(* the control plane that answered)"
    this, standby, silent, removed = _rows("\n".join(body))
    assert this == {
        "NAME": "cp1 *",
        "ROLE": "leader",
        "TERM": "4",
        "API": "10.0.0.1:8080",
        "AGENTS": "10.0.0.1:8443",
        "PEERS": "10.0.0.1:8444",
        "CONTACT": "-",
        "LAG": "-",
        "PROBLEM": "",
    }
    assert standby["NAME"] == "cp2" and standby["ROLE"] == "standby"
    assert standby["CONTACT"] == "3s ago" and standby["LAG"] == "1.3s"
    # No role: one that was never removed does not answer; a removed one says so.
    assert silent["ROLE"] == "not answering" and silent["TERM"] == "-"
    assert silent["PROBLEM"] == "no answer in 2 s"
    assert removed["ROLE"] == "removed" and removed["CONTACT"] == "4000s ago"


def test_a_contact_from_a_clock_ahead_is_not_in_the_future() -> None:
    table = servers_table([server(last_contact=NOW + 30)], now=NOW)  # type: ignore[list-item]
    assert _rows(table.split("\n(*")[0])[0]["CONTACT"] == "0s ago"


def test_ctl_servers_prints_the_table_or_the_apis_json(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    # No contact times here: the table's CONTACT column counts from the wall clock.
    listed = [server(this=True, last_contact=None), server(name="cp2", last_contact=None)]
    admin.answer("GET", "/api/v1/servers", listed)
    assert main(["ctl", "servers"]) == 0
    assert capsys.readouterr().out == servers_table(listed) + "\n"  # type: ignore[arg-type]
    assert main(["ctl", "servers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == listed
    assert admin.asked == [("GET", "/api/v1/servers", None)] * 2


def test_no_control_plane_recorded_is_said_in_words(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/servers", [])
    assert main(["ctl", "servers"]) == 0
    assert capsys.readouterr().out.startswith("No control planes recorded yet")


@pytest.mark.parametrize(
    ("ttl", "seconds"), [([], 3600), (["--ttl", "90"], 90), (["--ttl", "2h"], 7200)]
)
def test_server_token_asks_for_the_ttl_and_prints_the_token_alone(
    ttl: list[str], seconds: int, admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("POST", "/api/v1/servers/tokens", TOKEN)
    assert main(["server", "token", *ttl]) == 0
    # Only the token, so `llmgw server join --token "$(llmgw server token)"` works.
    assert capsys.readouterr().out == "llmgw-join-abc\n"
    assert admin.asked == [("POST", "/api/v1/servers/tokens", {"ttl_seconds": seconds})]
    assert main(["server", "token", *ttl, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == TOKEN


def test_server_token_refuses_a_ttl_that_is_no_duration(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["server", "token", "--ttl", "1w"])
    assert caught.value.code == 2
    assert "'1w' is not a duration" in capsys.readouterr().err
    assert admin.asked == []


@pytest.mark.parametrize(
    ("removed", "said"),
    [
        (True, "control plane cp/3 removed: its certificate is refused from now on"),
        (False, "control plane cp/3 was already removed"),
    ],
)
def test_server_remove_deletes_it_by_name(
    removed: bool, said: str, admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/api/v1/servers/cp%2F3"
    admin.answer("DELETE", path, {"name": "cp/3", "removed": removed})
    assert main(["server", "remove", "cp/3"]) == 0
    assert capsys.readouterr().out == said + "\n"
    assert main(["server", "remove", "cp/3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "cp/3", "removed": removed}
    assert admin.asked == [("DELETE", path, None)] * 2


@pytest.mark.parametrize(
    ("argv", "route"),
    [
        (["ctl", "servers"], ("GET", "/api/v1/servers")),
        (["server", "token"], ("POST", "/api/v1/servers/tokens")),
        (["server", "remove", "cp1"], ("DELETE", "/api/v1/servers/cp1")),
    ],
    ids=["servers", "token", "remove"],
)
def test_a_refusal_exits_1_with_the_control_planes_words(
    argv: list[str],
    route: tuple[str, str],
    admin: FakeAdmin,
    capsys: pytest.CaptureFixture[str],
) -> None:
    refused = AdminError(f"http://cp{route[1]}: cp1 is the leader; it cannot remove itself")
    admin.answer(*route, refused)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"llmgw: {refused}\n"


def test_join_and_promote_run_on_this_machines_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, admin: FakeAdmin
) -> None:
    ran: list[tuple[str, argparse.Namespace, Path]] = []

    def runner(name: str) -> Any:
        def run(args: argparse.Namespace, root: Path) -> int:
            ran.append((name, args, root))
            return 0

        return run

    monkeypatch.setattr("llmgw.server.ha.commands.cmd_join", runner("join"))
    monkeypatch.setattr("llmgw.server.ha.commands.cmd_promote", runner("promote"))
    join = ["server", "join", "--server", "10.0.0.1:8080", "--token", "llmgw-join-abc"]
    more = ["--name", "cp2", "--advertise", "10.0.0.2", "--advertise", "cp2.lan", "--yes"]
    assert main([*join, *more, "--data-dir", str(tmp_path)]) == 0
    assert main(["server", "promote", "--force", "--data-dir", str(tmp_path / "b")]) == 0
    (j, joined, root), (p, promoted, proot) = ran
    assert (j, root, p, proot) == ("join", tmp_path, "promote", tmp_path / "b")
    assert joined.server == "10.0.0.1:8080" and joined.token == "llmgw-join-abc"
    assert joined.name == "cp2" and joined.advertise == ["10.0.0.2", "cp2.lan"] and joined.yes
    assert joined.peer_port is None and joined.agent_port is None  # the command's defaults
    assert promoted.force is True
    assert admin.asked == []  # neither asks a control plane through the admin client


def test_join_needs_the_leader_and_a_token(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["server", "join", "--server", "10.0.0.1:8080"])
    assert caught.value.code == 2
    assert "--token" in capsys.readouterr().err


def test_server_add_hands_its_options_and_the_client_to_add_server(
    monkeypatch: pytest.MonkeyPatch, admin: FakeAdmin
) -> None:
    given: list[tuple[argparse.Namespace, object]] = []

    def add_server(args: argparse.Namespace, client: object) -> int:
        given.append((args, client))
        return 3

    monkeypatch.setattr("llmgw.client.serveradd.add_server", add_server)
    argv = ["server", "add", "gpu-7", "--vip", "10.0.0.100/24", "--ssh-option", "A=b"]
    assert main(argv) == 3
    ((args, client),) = given
    assert client is admin
    assert args.host == "gpu-7" and args.vip == "10.0.0.100/24" and args.ssh_option == ["A=b"]
    assert (args.ssh_port, args.prefix, args.listen) == (22, "/opt/llmgw", "0.0.0.0:8080")
    assert (args.agent_port, args.peer_port, args.timeout) == (8443, 8444, 120)
