"""`ctl model adapter add|remove|list`: the calls they make, what they print, and
``--json`` as the API's stable list."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from llmgw.cli import build_parser
from llmgw.client.admin import AdminClient
from llmgw.client.ctl_adapters import adapters_table, commands

LISTED = [
    {"name": "sql", "source": "hf:org/sql:sql.gguf", "scale": 0.5},
    {"name": "chat", "source": "/loras/chat.gguf", "scale": 1.0},
]


class FakeAdmin(AdminClient):
    def __init__(self) -> None:
        super().__init__("http://cp", "t")
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        return LISTED[1:] if method == "DELETE" else LISTED


def run(argv: list[str]) -> tuple[FakeAdmin, argparse.Namespace]:
    admin = FakeAdmin()
    args = build_parser().parse_args(["ctl", "model", "adapter", *argv])
    handler = commands(lambda _: admin)[args.adapter_command]
    assert handler(args) == 0
    return admin, args


def test_each_command_is_one_call(capsys: pytest.CaptureFixture[str]) -> None:
    admin, _ = run(["add", "m", "sql", "hf:org/sql:sql.gguf", "--scale", "0.5"])
    assert admin.calls == [
        (
            "POST",
            "/api/v1/models/m/adapters",
            {"name": "sql", "source": "hf:org/sql:sql.gguf", "scale": 0.5},
        )
    ]
    said = capsys.readouterr().out
    assert "added sql to m" in said and "hf:org/sql:sql.gguf" in said
    admin, _ = run(["add", "m", "chat", "/loras/chat.gguf"])
    assert admin.calls[0][2] == {"name": "chat", "source": "/loras/chat.gguf"}
    admin, _ = run(["remove", "m", "sql"])
    assert admin.calls == [("DELETE", "/api/v1/models/m/adapters/sql", None)]
    assert "removed sql from m" in capsys.readouterr().out
    admin, _ = run(["list", "m/x"])
    assert admin.calls == [("GET", "/api/v1/models/m%2Fx/adapters", None)]


def test_json_is_the_apis_list_and_the_table_reads_at_a_glance(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run(["list", "m", "--json"])
    assert json.loads(capsys.readouterr().out) == LISTED
    run(["add", "m", "sql", "/x.gguf", "--json"])
    assert json.loads(capsys.readouterr().out) == LISTED  # nothing else on stdout
    table = adapters_table("m", LISTED)
    assert table.splitlines()[0].split() == ["NAME", "SCALE", "SOURCE"]
    assert table.splitlines()[1].split() == ["sql", "0.5", "hf:org/sql:sql.gguf"]
    assert "m:NAME" in table
    assert "has no LoRA adapters" in adapters_table("m", [])


def test_no_source_is_the_fine_tune_of_that_name() -> None:
    admin, _ = run(["add", "m", "tuned"])
    assert admin.calls == [
        ("POST", "/api/v1/models/m/adapters", {"name": "tuned", "source": "finetune:tuned"})
    ]
