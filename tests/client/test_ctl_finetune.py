"""`ctl finetune create|list|show|cancel`: the calls they make (the pairs file read and
sent whole), what they print, and ``--json`` as the API's job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.cli import build_parser
from llmgw.client.admin import AdminClient
from llmgw.client.ctl_finetune import jobs_table

JOB = {
    "id": "ft-0123456789ab",
    "name": "tuned",
    "model": "m",
    "node": "gpu-1",
    "state": "training",
    "epochs": 1,
    "rank": 8,
    "mib": 8000,
    "pairs": 20,
    "step": 3,
    "steps": 5,
    "loss": [2.5, 2.0, 1.25],
    "peak_mib": 812.5,
    "error": None,
    "created": 1.7e9,
    "updated": 1.7e9,
    "adapter_bytes": None,
    "base": "hf:org/tiny",
    "device": "cuda",
    "doing": None,
}


class FakeAdmin(AdminClient):
    def __init__(self) -> None:
        super().__init__("http://cp", "t")
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        return [JOB] if path == "/api/v1/finetunes" and method == "GET" else JOB


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[FakeAdmin, int]:
    admin = FakeAdmin()
    monkeypatch.setattr("llmgw.cli._client", lambda args: admin)
    args = build_parser().parse_args(["ctl", "finetune", *argv])
    return admin, args.handler(args)


def test_create_sends_the_pairs_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "a", "completion": "b"}\n')
    argv = ["create", "--model", "m", "--data", str(pairs), "--name", "tuned", "--rank", "8"]
    admin, code = run(argv, monkeypatch)
    assert code == 0
    assert admin.calls == [
        (
            "POST",
            "/api/v1/finetunes",
            {"model": "m", "name": "tuned", "data": pairs.read_text(), "rank": 8},
        )
    ]
    said = capsys.readouterr().out
    assert "sent to gpu-1" in said and "loss 2.500 -> 1.250" in said and "812 MiB" in said


def test_a_missing_or_large_file_is_said_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match="--data .*nope.jsonl"):
        run(
            ["create", "--model", "m", "--data", str(tmp_path / "nope.jsonl"), "--name", "t"],
            monkeypatch,
        )
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (32 * 1024 * 1024 + 1))
    with pytest.raises(SystemExit, match="larger than 32 MiB"):
        run(["create", "--model", "m", "--data", str(big), "--name", "t"], monkeypatch)


def test_list_show_cancel(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    admin, _ = run(["list", "--json"], monkeypatch)
    assert json.loads(capsys.readouterr().out) == [JOB]
    admin, _ = run(["show", JOB["id"]], monkeypatch)
    assert admin.calls == [("GET", f"/api/v1/finetunes/{JOB['id']}", None)]
    assert "step:      3/5" in capsys.readouterr().out
    admin, _ = run(["cancel", JOB["id"]], monkeypatch)
    assert admin.calls == [("POST", f"/api/v1/finetunes/{JOB['id']}/cancel", {})]


def test_the_table() -> None:
    assert "No fine-tunes" in jobs_table([])
    table = jobs_table([JOB])  # type: ignore[list-item]
    assert "ft-0123456789ab" in table and "3/5" in table and "2.500 -> 1.250" in table
