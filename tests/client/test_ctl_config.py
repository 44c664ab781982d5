"""``llmgw ctl config get|set|unset|history``: what each asks the admin API (path and
body), what it prints (the API's JSON with --json, else YAML or a table), and the exit
status when the control plane refuses; against a stand-in client."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

from llmgw.cli import main
from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_config import document_text, history_table
from tests.support.fakeadmin import FakeAdmin, install

SETTINGS = {
    "default": {"discovery": {"slow_interval": 30}, "engines": {"llama.cpp": "/opt/x"}},
    "nodes": {"n2": {"heartbeat_interval": 2.5}},
    "version": 7,
}
# 2024-03-01 12:00:00 UTC and a minute later.
AT = dt.datetime(2024, 3, 1, 12, 0, 0, tzinfo=dt.UTC).timestamp()
HISTORY = [
    {
        "at": AT + 60,
        "actor": "admin@cp1",
        "action": "agents.unset",
        "layer": "node n2",
        "change": "heartbeat_interval",
    },
    {
        "at": AT,
        "actor": "admin@cp1",
        "action": "agents.set",
        "layer": "default",
        "change": "discovery.slow_interval = 30",
    },
]


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_get_prints_every_layer_as_agent_yaml_would_say_it(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/config", SETTINGS)
    assert main(["ctl", "config", "get"]) == 0
    out = capsys.readouterr().out
    # The agents: section of a settings file, whole; the version is the API's, not YAML's.
    assert yaml.safe_load(out) == {
        "agents": {"default": SETTINGS["default"], "nodes": SETTINGS["nodes"]}
    }
    assert out == document_text(SETTINGS) + "\n"
    assert main(["ctl", "config", "get", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == SETTINGS
    assert admin.asked == [("GET", "/api/v1/config", None)] * 2


def test_an_empty_document_is_still_both_layers() -> None:
    assert yaml.safe_load(document_text({"default": {}, "nodes": {}, "version": 0})) == {
        "agents": {"default": {}, "nodes": {}}
    }
    # A layer the API left out (or null) is shown empty, not as null.
    assert yaml.safe_load(document_text({"version": 0})) == {  # type: ignore[typeddict-item]
        "agents": {"default": {}, "nodes": {}}
    }


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (30, "30"),
        (2.5, "2.5"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        ("/opt/llama", "/opt/llama"),
        (["a", "b"], "- a\n- b"),
        ({"llama.cpp": "/opt/x"}, "llama.cpp: /opt/x"),
    ],
)
def test_get_a_key_prints_its_value_as_yaml_without_the_end_marker(
    value: object, shown: str, admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/api/v1/config?key=discovery.slow_interval"
    answer = {"key": "discovery.slow_interval", "node": None, "value": value}
    admin.answer("GET", path, answer)
    assert main(["ctl", "config", "get", "discovery.slow_interval"]) == 0
    out = capsys.readouterr().out
    assert out == shown + "\n"
    assert yaml.safe_load(out) == value  # what a person reads back is the value
    assert main(["ctl", "config", "get", "discovery.slow_interval", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == answer


def test_get_a_key_of_a_nodes_layer_asks_for_that_node_and_says_unset(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/api/v1/config?key=weights_dir&node=n1"
    admin.answer("GET", path, {"key": "weights_dir", "node": "n1", "value": None})
    assert main(["ctl", "config", "get", "weights_dir", "--node", "n1"]) == 0
    assert capsys.readouterr().out == "(unset)\n"
    assert admin.asked == [("GET", path, None)]


def test_get_node_prints_what_that_node_is_given(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    merged = {"heartbeat_interval": 2.5, "discovery": {"slow_interval": 30}}
    admin.answer("GET", "/api/v1/config?node=n2", {"node": "n2", "settings": merged})
    assert main(["ctl", "config", "get", "--node", "n2"]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out) == merged
    # Sorted by key, so two nodes' settings read side by side.
    assert out.index("discovery:") < out.index("heartbeat_interval:")
    assert main(["ctl", "config", "get", "--node", "n2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"node": "n2", "settings": merged}

    admin.answer("GET", "/api/v1/config?node=n3", {"node": "n3", "settings": {}})
    assert main(["ctl", "config", "get", "--node", "n3"]) == 0
    assert capsys.readouterr().out == "{}\n"


@pytest.mark.parametrize(
    ("argv", "body", "said"),
    [
        (
            ["set", "discovery.slow_interval", "30"],
            {"key": "discovery.slow_interval", "unset": False, "value": "30"},
            "discovery.slow_interval set for every node",
        ),
        (
            ["set", "engines", "{llama.cpp: /opt/x}", "--node", "n1"],
            {"key": "engines", "unset": False, "value": "{llama.cpp: /opt/x}", "node": "n1"},
            "engines set for node n1",
        ),
        (
            ["unset", "weights_dir"],
            {"key": "weights_dir", "unset": True},
            "weights_dir unset for every node",
        ),
        (
            ["unset", "weights_dir", "--node", "n1"],
            {"key": "weights_dir", "unset": True, "node": "n1"},
            "weights_dir unset for node n1",
        ),
    ],
    ids=["set", "set-node", "unset", "unset-node"],
)
def test_set_and_unset_send_the_key_its_text_and_the_layer(
    argv: list[str],
    body: dict[str, object],
    said: str,
    admin: FakeAdmin,
    capsys: pytest.CaptureFixture[str],
) -> None:
    admin.answer("POST", "/api/v1/config", SETTINGS)
    assert main(["ctl", "config", *argv]) == 0
    assert capsys.readouterr().out == said + "\n"
    # The value goes as typed: the control plane reads it as YAML and checks it.
    assert admin.asked == [("POST", "/api/v1/config", body)]
    assert main(["ctl", "config", *argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == SETTINGS


def test_a_refused_change_exits_1_with_the_control_planes_words(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    words = "http://cp/api/v1/config: node_id is who the node is; agent.yaml says it"
    admin.answer("POST", "/api/v1/config", AdminError(words))
    assert main(["ctl", "config", "set", "node_id", "x"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"llmgw: {words}\n"
    admin.answer("GET", "/api/v1/config", AdminError("cannot reach the control plane"))
    assert main(["ctl", "config", "get", "--json"]) == 1
    assert capsys.readouterr().err == "llmgw: cannot reach the control plane\n"


def test_history_lists_each_change_newest_first(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/config/history", HISTORY)
    assert main(["ctl", "config", "history"]) == 0
    head, newest, oldest = capsys.readouterr().out.splitlines()
    assert head.split() == ["WHEN", "(UTC)", "WHO", "LAYER", "CHANGE"]
    assert newest.startswith("2024-03-01 12:01:00")
    assert "node n2" in newest and newest.endswith("unset heartbeat_interval")
    assert oldest.startswith("2024-03-01 12:00:00")
    assert oldest.endswith("discovery.slow_interval = 30") and "unset" not in oldest
    # The columns line up: each starts where its head does.
    for row in (newest, oldest):
        assert row.index("admin@cp1") == head.index("WHO")
    assert main(["ctl", "config", "history", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == HISTORY
    assert admin.asked == [("GET", "/api/v1/config/history", None)] * 2


def test_history_says_so_when_nothing_was_changed_and_dashes_what_is_missing() -> None:
    assert history_table([]) == "No agent setting has been changed yet."
    row = history_table([{"change": "x = 1"}]).splitlines()[1]  # type: ignore[typeddict-item]
    assert row.split() == ["-", "-", "-", "x", "=", "1"]
