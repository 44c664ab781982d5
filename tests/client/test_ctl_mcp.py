"""``llmgw ctl mcp`` against a real control plane's admin API over HTTP and the SDK's
tool server: add with a credential file (sealed: named, never printed), list, show,
test (the credential reaches the server), set, off and on, remove; refusals in the
control plane's words; ``--json`` is the API's shape."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import main
from llmgw.wire.admin import McpServerJson, McpTestJson
from tests.support.adminserver import Served, serving
from tests.support.mcptools import ToolServer
from tests.support.shapes import check


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path / "data") as served:
        yield served


class Ctl:
    def __init__(self, served: Served, capsys: pytest.CaptureFixture[str]) -> None:
        self.served = served
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        given = ["--server", self.served.base, "--token", self.served.token]
        try:
            code = main(["ctl", *argv, *given])
        except SystemExit as exc:
            code = 1 if exc.code else 0
            print(exc.code, file=sys.stderr)
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def ctl(cp: Served, capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(cp, capsys)


def test_add_test_set_off_on_remove(ctl: Ctl, cp: Served, tmp_path: Path) -> None:
    secret = tmp_path / "jira.secret"
    secret.write_text("X-Api-Key: k3y-s3cr3t\n")
    with ToolServer("X-Api-Key", "k3y-s3cr3t") as tools:
        code, out, err = ctl(
            "mcp", "add", "jira", tools.url, "--secret-file", str(secret), "--rate", "10"
        )
        assert code == 0, err
        assert "X-Api-Key (sealed)" in out and "k3y-s3cr3t" not in out
        code, out, err = ctl("mcp", "test", "jira")
        assert code == 0, err
        assert "jira: ok, 4 tool(s)" in out and "echo" in out
        assert "k3y-s3cr3t" in tools.seen
        found: McpTestJson = ctl.json("mcp", "test", "jira")
        check(McpTestJson, found)
        code, out, _ = ctl("mcp", "list")
        assert code == 0 and "jira" in out and "llmgw:admin" in out and "10/min" in out
        shown: McpServerJson = ctl.json("mcp", "show", "jira")
        check(McpServerJson, shown)
        assert shown["headers"] == [{"name": "X-Api-Key", "sealed": True, "value": None}]
        assert ctl.json("mcp", "set", "jira", "--clear", "rate")["rate"] is None
        assert ctl.json("mcp", "off", "jira")["enabled"] is False
        assert ctl.json("mcp", "on", "jira")["enabled"] is True
        code, out, _ = ctl("mcp", "remove", "jira")
        assert code == 0 and "removed jira" in out
    audit = json.dumps(cp.run(cp.cp.store.audit_log()))
    assert "mcp.add" in audit and "mcp.remove" in audit and "k3y-s3cr3t" not in audit


def test_refusals_say_what_was_wrong(ctl: Ctl, tmp_path: Path) -> None:
    code, _, err = ctl("mcp", "add", "jira", "https://bob:hunter2@jira.example.com/mcp")
    assert code != 0 and "url" in err and "--bearer-file or --secret-file" in err
    assert "hunter2" not in err
    code, _, err = ctl("mcp", "remove", "llmgw:admin")
    assert code != 0 and "cannot be removed" in err
    code, _, err = ctl("mcp", "add", "jira", "https://j.example.com/mcp", "--bearer-file", "/nope")
    assert code != 0 and "--bearer-file /nope" in err
    code, out, _ = ctl("mcp", "show", "llmgw:admin")
    assert code == 0 and "(built in)" in out and "answered by the control plane" in out
