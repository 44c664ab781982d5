"""``llmgw ctl engines [set|unset|history]`` and ``llmgw ctl engine-build NODE BUILD``:
what each asks the admin API (path and body), what it prints (the API's JSON with
--json, else the tables) and its exit status when refused; against a stand-in client."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from llmgw.cli import main
from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_engines import nodes_table, parse_pins, wanted_table
from tests.support.fakeadmin import FakeAdmin, install

ENGINES = {
    "version": 3,
    "engines": [
        {
            "engine": "llama.cpp",
            "version": "b6000",
            "sha256": {"llama-b6000-bin-ubuntu-x64.tar.gz": "ab" * 32, "llama-b6000-arm64": "cd"},
            "index_url": None,
            "source": "https://github.com/ggml-org/llama.cpp/releases",
        },
        {"engine": "vllm", "version": "0.11.0", "sha256": {}, "index_url": None, "source": ""},
    ],
    "builds": {"n1": "cu13"},
    "nodes": [
        {
            "node": "n1",
            "engine": "llama.cpp",
            "wanted": "b6000",
            "versions": ["b5900", "b6000"],
            "build": "cu13",
            "state": "ready",
            "message": None,
        },
        {
            "node": "n2",
            "engine": "vllm",
            "wanted": "0.11.0",
            "versions": [],
            "build": "auto",
            "state": "failed",
            "message": "pip: no matching distribution",
        },
    ],
}
NONE = {"version": 0, "engines": [], "builds": {}, "nodes": []}
AT = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC).timestamp()
HISTORY = [
    {"at": AT, "actor": "admin@cp1", "action": "engines.set", "target": "vllm", "change": "0.11"}
]


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def _columns(table: str) -> list[dict[str, str]]:
    """Each row of a rendered table by its head's columns (cut where each head starts)."""
    head, *rows = table.splitlines()
    names = head.split("  ")
    names = [n.strip() for n in names if n.strip()]
    starts = [head.index(n) for n in names]
    ends = [*starts[1:], None]
    return [
        {n: row[s:e].strip() for n, s, e in zip(names, starts, ends, strict=True)} for row in rows
    ]


def test_engines_prints_what_the_fleet_runs_then_each_nodes_standing(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/engines", ENGINES)
    assert main(["ctl", "engines"]) == 0
    wanted, standing = capsys.readouterr().out.rstrip("\n").split("\n\n")
    assert wanted == wanted_table(ENGINES) and standing == nodes_table(ENGINES)  # type: ignore[arg-type]
    llama, vllm = _columns(wanted)
    assert llama == {
        "ENGINE": "llama.cpp",
        "VERSION": "b6000",
        "FROM": "https://github.com/ggml-org/llama.cpp/releases",
        # The assets a digest is pinned for, sorted; never the digests themselves.
        "SHA256 PINNED FOR": "llama-b6000-arm64, llama-b6000-bin-ubuntu-x64.tar.gz",
    }
    assert vllm["FROM"] == "-" and vllm["SHA256 PINNED FOR"] == "-"
    n1, n2 = _columns(standing)
    assert n1 == {
        "NODE": "n1",
        "ENGINE": "llama.cpp",
        "WANTED": "b6000",
        "HAS": "b5900, b6000",
        "BUILD": "cu13",
        "STATE": "ready",
        "WORDS": "",
    }
    assert n2["HAS"] == "-" and n2["STATE"] == "failed"
    assert n2["WORDS"] == "pip: no matching distribution"

    assert main(["ctl", "engines", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ENGINES
    assert admin.asked == [("GET", "/api/v1/engines", None)] * 2


def test_engines_says_so_when_the_fleet_names_none_and_no_node_registered(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/engines", NONE)
    assert main(["ctl", "engines"]) == 0
    assert capsys.readouterr().out == (
        "The fleet names no engine: each node runs what it was given.\n\n"
        "No node has registered yet.\n"
    )


def test_set_sends_the_version_its_pins_and_index(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("POST", "/api/v1/engines", ENGINES)
    argv = ["ctl", "engines", "set", "llama.cpp", "b6000"]
    pins = ["--sha256", "llama-b6000-bin-ubuntu-x64.tar.gz=" + "ab" * 32, "--sha256", "a=b=c"]
    assert main([*argv, *pins]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the fleet runs llama.cpp b6000: every node installs it")
    assert admin.asked[-1] == (
        "POST",
        "/api/v1/engines",
        {
            "engine": "llama.cpp",
            "unset": False,
            "version": "b6000",
            # An asset's name ends at the first "=": the rest is its digest.
            "sha256": {"llama-b6000-bin-ubuntu-x64.tar.gz": "ab" * 32, "a": "b=c"},
        },
    )
    argv = ["ctl", "engines", "set", "vllm", "0.11.0", "--index-url", "https://pypi.example/simple"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ENGINES
    assert admin.asked[-1][2] == {
        "engine": "vllm",
        "unset": False,
        "version": "0.11.0",
        "sha256": {},  # none given: an empty map, not left out
        "index_url": "https://pypi.example/simple",
    }


def test_set_sends_the_engines_os_packages_per_manager(admin: FakeAdmin) -> None:
    admin.answer("POST", "/api/v1/engines", ENGINES)
    argv = ["ctl", "engines", "set", "llama.cpp", "b6000", "--package", "apt=libgomp1"]
    assert main([*argv, "--package", "dnf=libgomp", "--package", "apt=libcurl4"]) == 0
    assert admin.asked[-1][2]["packages"] == {"apt": ["libgomp1", "libcurl4"], "dnf": ["libgomp"]}
    with pytest.raises(SystemExit, match="--package takes apt=NAME or dnf=NAME"):
        main([*argv[:-2], "--package", "yum=libgomp"])


@pytest.mark.parametrize("pin", ["no-equals-sign", "=deadbeef", "asset="])
def test_a_malformed_pin_is_refused_before_anything_is_sent(pin: str, admin: FakeAdmin) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["ctl", "engines", "set", "llama.cpp", "b6000", "--sha256", pin])
    assert "--sha256 takes ASSET=HEX" in str(caught.value) and repr(pin) in str(caught.value)
    assert admin.asked == []


def test_parse_pins_keeps_each_asset_once_the_last_given_winning() -> None:
    assert parse_pins([]) == {}
    assert parse_pins(["a=1", "b=2", "a=3"]) == {"a": "3", "b": "2"}


def test_unset_sends_only_the_engine(admin: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    admin.answer("POST", "/api/v1/engines", NONE)
    assert main(["ctl", "engines", "unset", "vllm"]) == 0
    assert capsys.readouterr().out == (
        "the fleet no longer names vllm; its installs stay where they are\n"
    )
    assert admin.asked == [("POST", "/api/v1/engines", {"engine": "vllm", "unset": True})]
    assert main(["ctl", "engines", "unset", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == NONE


def test_history_lists_each_change_or_says_there_was_none(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/engines/history", HISTORY)
    assert main(["ctl", "engines", "history"]) == 0
    (row,) = _columns(capsys.readouterr().out)
    assert row == {"WHEN (UTC)": "2024-05-06 07:08:09", "WHO": "admin@cp1", "CHANGE": "0.11"}
    assert main(["ctl", "engines", "history", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == HISTORY
    admin.answer("GET", "/api/v1/engines/history", [])
    assert main(["ctl", "engines", "history"]) == 0
    assert capsys.readouterr().out == "The fleet's engines have not been changed yet.\n"
    assert main(["ctl", "engines", "history", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize("build", ["auto", "cu13", "cu129", "cpu", "none"])
def test_engine_build_posts_the_build_for_the_node(
    build: str, admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/api/v1/nodes/gpu%2F1/engine-build"
    admin.answer("POST", path, ENGINES)
    assert main(["ctl", "engine-build", "gpu/1", build]) == 0
    assert capsys.readouterr().out == f"gpu/1 installs the {build} build of its engines\n"
    assert admin.asked == [("POST", path, {"build": build})]
    assert main(["ctl", "engine-build", "gpu/1", build, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ENGINES


def test_engine_build_refuses_a_build_it_does_not_know(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["ctl", "engine-build", "n1", "cu11"])
    assert caught.value.code == 2
    assert "invalid choice: 'cu11'" in capsys.readouterr().err
    assert admin.asked == []


@pytest.mark.parametrize(
    "argv",
    [
        ["engines"],
        ["engines", "set", "llama.cpp", "b6000"],
        ["engines", "unset", "vllm"],
        ["engines", "history"],
        ["engine-build", "n1", "cpu"],
    ],
    ids=["engines", "set", "unset", "history", "engine-build"],
)
def test_a_refusal_exits_1_with_the_control_planes_words(
    argv: list[str], admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = AdminError("http://cp/api/v1/engines: the store cannot be written now")
    for route in (
        ("GET", "/api/v1/engines"),
        ("POST", "/api/v1/engines"),
        ("GET", "/api/v1/engines/history"),
        ("POST", "/api/v1/nodes/n1/engine-build"),
    ):
        admin.answer(*route, refused)
    assert main(["ctl", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"llmgw: {refused}\n"
    assert len(admin.asked) == 1


def test_options_given_before_the_action_are_not_dropped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = FakeAdmin()
    admin.answer("GET", "/api/v1/engines/history", HISTORY)
    reached: list[tuple[str | None, str | None, Path | None]] = []

    def resolve(server: str | None, token: str | None, data_dir: Path | None) -> FakeAdmin:
        reached.append((server, token, data_dir))
        return admin

    monkeypatch.setattr("llmgw.client.admin.resolve", resolve)
    assert main(["ctl", "engines", "--server", "cp1:8080", "--json", "history"]) == 0
    assert reached == [("cp1:8080", None, None)]
    assert json.loads(capsys.readouterr().out) == HISTORY
