"""``llmgw ctl nodes|status|replicas|logs|weights|shard``: what each asks the admin API,
and what it prints (the API's JSON as it came with --json, else a table), against a
stand-in client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.cli import main
from llmgw.client.admin import AdminClient
from llmgw.client.tables import (
    collect_text,
    nodes_table,
    replicas_table,
    status_text,
    weights_table,
)

NODES = [{"id": "n1", "state": "Ready", "version": "0.1", "cards": [], "connected": True}]
STATUS = {"nodes": {"total": 1, "ready": 1}, "version": "0.1", "store": {"backend": "sqlite"}}
REPLICAS = [{"replica_id": "r1", "node": "n1", "state": "Ready", "port": 9000, "model": "m"}]
WEIGHTS = [{"node": "n1", "source": "hf:org/repo", "bytes": 1024, "used_by": []}]
COLLECTED = [
    {
        "node": "n1",
        "asked": ["hf:org/repo"],
        "removed": ["hf:org/repo"],
        "freed_bytes": 1024,
        "kept": [],
    },
    {"node": "n2", "error": "not connected"},
]


class Client(AdminClient):
    """The admin API as the commands use it: every call kept, answers from a table."""

    def __init__(self, answers: dict[tuple[str, str], Any]) -> None:
        super().__init__("http://cp", "t")
        self.answers = answers
        self.asked: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.asked.append((method, path, body))
        return self.answers[(method, path)]

    def stream(self, path: str) -> Any:
        self.asked.append(("STREAM", path, None))
        yield from self.answers[("STREAM", path)]


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Client:
    client = Client({})
    monkeypatch.setattr("llmgw.client.admin.resolve", lambda *a: client)
    return client


@pytest.mark.parametrize(
    ("argv", "path", "answer", "table"),
    [
        (["nodes"], "/api/v1/nodes", NODES, nodes_table),
        (["status"], "/api/v1/status", STATUS, status_text),
        (["replicas"], "/api/v1/replicas", REPLICAS, replicas_table),
        (["weights"], "/api/v1/weights", WEIGHTS, weights_table),
        (["weights", "n1"], "/api/v1/weights?node=n1", WEIGHTS, weights_table),
    ],
    ids=["nodes", "status", "replicas", "weights", "weights-of-a-node"],
)
def test_a_listing_prints_the_apis_json_or_its_table(
    argv: list[str],
    path: str,
    answer: Any,
    table: Any,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client.answers[("GET", path)] = answer
    assert main(["ctl", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out == json.dumps(answer, indent=2) + "\n"
    assert main(["ctl", *argv]) == 0
    assert capsys.readouterr().out == table(answer) + "\n"
    assert client.asked == [("GET", path, None)] * 2


def test_weights_collect_asks_the_nodes_to_delete_what_no_shard_uses(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.answers[("POST", "/api/v1/weights/collect")] = COLLECTED
    assert main(["ctl", "weights", "--collect"]) == 0
    assert capsys.readouterr().out == collect_text(COLLECTED) + "\n"
    assert main(["ctl", "weights", "n1", "--collect", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == COLLECTED
    assert [body for _, _, body in client.asked] == [{}, {"node": "n1"}]


def test_logs_asks_for_the_source_and_line_count(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.answers[("GET", "/api/v1/nodes/n1/logs?source=r1&n=5")] = ["one", "two"]
    assert main(["ctl", "logs", "n1", "--source", "r1", "-n", "5"]) == 0
    assert capsys.readouterr().out == "one\ntwo\n"


def test_logs_follow_prints_each_batch_and_stops_on_an_error(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/api/v1/nodes/n1/logs?source=agent&n=100&follow=1"
    client.answers[("STREAM", path)] = [["a"], ["b", "c"], {"error": "the node went away"}]
    assert main(["ctl", "logs", "n1", "-f"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "a\nb\nc\n"
    assert captured.err == "llmgw: the node went away\n"


def test_shard_start_sends_the_spec_given(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.answers[("POST", "/api/v1/nodes/n1/shards")] = {"started": True}
    argv = ["ctl", "shard", "start", "n1", "r1", "--source", "/m.gguf", "--port", "9000"]
    assert main([*argv, "--card", "GPU-1", "--arg=-c", "--arg", "4096", "--model", "m"]) == 0
    assert capsys.readouterr().out == "asked n1 to start r1; see `llmgw ctl replicas`\n"
    assert client.asked[-1][2] == {
        "replica_id": "r1",
        "engine": "llama.cpp",
        "source": "/m.gguf",
        "port": 9000,
        "args": ["-c", "4096"],
        "cards": ["GPU-1"],
        "allow_pickle": False,
        "model": "m",
    }
    assert main([*argv, "--cpu-cores", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"started": True}
    body = client.asked[-1][2]
    assert body["cpu_cores"] == 4 and "model" not in body and body["args"] == []


def test_shard_stop(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    client.answers[("DELETE", "/api/v1/nodes/n1/shards/r1")] = {"stopping": True}
    assert main(["ctl", "shard", "stop", "n1", "r1"]) == 0
    assert capsys.readouterr().out == "asked n1 to stop r1\n"
    assert main(["ctl", "shard", "stop", "n1", "r1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"stopping": True}
