"""``ctl keys``: the priority a key is made with and changed to, as sent to the admin
API, and its column in the table."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from llmgw.client.admin import AdminClient
from llmgw.client.ctl_keys import add_parsers, keys_table


class FakeApi(AdminClient):
    """The admin API's client: what was asked, and an answer to each."""

    def __init__(self) -> None:
        super().__init__("http://cp", "t")
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        if path.endswith("/limits"):
            return limits_json(**body)
        if method == "POST":
            return key_json(id="k1", key="sk-llmgw-x", **body)
        if method == "GET":
            return [key_json()]
        return key_json(state="revoked")


def limits_json(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "rpm": None,
        "tpm": None,
        "budget": None,
        "models": [],
        "tools": None,
        "guard": [],
        "revoked": [],
    }
    return {**base, **{k: v for k, v in kw.items() if k in base}}


def key_json(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "k1",
        "name": "batch",
        "state": "active",
        "models": [],
        "rpm": None,
        "tpm": None,
        "budget": None,
        "priority": 0,
        "expires_at": None,
        "tools": None,
        "guard": [],
    }
    return {**base, **kw}


def run(argv: list[str]) -> tuple[FakeApi, int]:
    api = FakeApi()
    root = argparse.ArgumentParser(prog="llmgw")
    roles = root.add_subparsers(dest="command")
    ctl = roles.add_parser("ctl").add_subparsers(dest="ctl_command")
    add_parsers(roles, ctl, lambda args: api, lambda parser: None)
    args = root.parse_args(argv)
    return api, args.handler(args)


def test_create_and_update_send_the_priority(capsys: pytest.CaptureFixture[str]) -> None:
    api, code = run(["ctl", "keys", "create", "--name", "batch", "--priority", "-2"])
    assert code == 0 and api.calls == [("POST", "/api/v1/keys", {"name": "batch", "priority": -2})]
    api, code = run(["ctl", "keys", "create", "--name", "web"])
    assert api.calls == [("POST", "/api/v1/keys", {"name": "web"})]  # the server's default
    capsys.readouterr()
    api, code = run(["ctl", "keys", "update", "k1", "--priority", "5", "--json"])
    assert code == 0 and api.calls == [("POST", "/api/v1/keys/k1", {"priority": 5})]
    assert json.loads(capsys.readouterr().out)["priority"] == 5


def test_the_table_shows_each_keys_priority() -> None:
    table = keys_table([key_json(priority=5), key_json(id="k2", name="web", priority=-1)])
    head, first, second = table.splitlines()[:3]
    column = head.split().index("PRIORITY")
    assert first.split()[column] == "5" and second.split()[column] == "-1"


def test_limits_send_tools_guard_revoke_and_clear(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["ctl", "keys", "limits", "k1", "--tools", "jira.*, wiki.get", "--guard", "pii"]
    api, code = run([*argv, "--rpm", "5", "--clear", "budget"])
    assert code == 0 and api.calls == [
        (
            "POST",
            "/api/v1/keys/k1/limits",
            {"rpm": 5, "tools": ["jira.*", "wiki.get"], "guard": ["pii"], "clear": ["budget"]},
        )
    ]
    assert "tools jira.*,wiki.get, guard pii" in capsys.readouterr().out
    # '' closes the key to every tool, and the answer says how to open it.
    api, code = run(["ctl", "keys", "limits", "k1", "--tools", ""])
    assert api.calls == [("POST", "/api/v1/keys/k1/limits", {"tools": []})]
    assert capsys.readouterr().out.splitlines()[-1] == (
        "closed: no tool until `--clear tools` opens it"
    )
    api, code = run(["ctl", "keys", "limits", "k1", "--revoke-tools", "jira"])
    assert api.calls == [("POST", "/api/v1/keys/k1/limits", {"revoke_tools": "jira"})]


def test_the_table_shows_each_keys_tools() -> None:
    table = keys_table(
        [
            key_json(),
            key_json(id="k2", tools=[]),
            key_json(id="k3", tools=["jira.*", "wiki.get"], guard=["pii"]),
        ]
    )
    head, *rows = table.splitlines()
    tools, guard = head.split().index("TOOLS"), head.split().index("GUARD")
    assert [(r.split()[tools], r.split()[guard]) for r in rows] == [
        ("none", "-"),
        ("closed", "-"),
        ("jira.*,wiki.get", "pii"),
    ]
