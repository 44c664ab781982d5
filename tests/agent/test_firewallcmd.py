"""``llmgw firewall status|sync`` (``llmgw.agent.firewallcmd``): the state dir each picks,
the plan it loads from there, what it says and how it exits, with and without root and
nft. ``Nft`` is stood in by a recorder for every test here, so nothing reads or changes
this machine's ruleset; whether this machine runs as root or has nft is stood in too."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.agent.firewall import (
    ROOT_NOTE,
    STATE_FILE,
    FirewallError,
    FirewallPlan,
    FirewallStatus,
    save_plan,
)
from llmgw.agent.firewallcmd import state_dir, status_text
from llmgw.cli import main

PLAN = FirewallPlan(networks=("10.213.40.0/24",), control_planes=("10.213.40.2",), agent_port=8443)
RULES = ["table inet llmgw {", "  chain input {", "  }", "}"]


def status(**kw: object) -> FirewallStatus:
    base = FirewallStatus(present=False, in_sync=None, rules=[], problem=None, nft=True)
    return {**base, **kw}  # type: ignore[typeddict-item]


@dataclass
class Nfts:
    """Every Nft the command made, what each was asked, and what each answers."""

    answer: FirewallStatus = field(default_factory=status)
    removed: bool = True
    refuse: FirewallError | None = None
    asked: list[tuple[str, FirewallPlan | None]] = field(default_factory=list)
    made: int = 0


@pytest.fixture
def nfts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Nfts]:
    nfts = Nfts()

    class FakeNft:
        def __init__(self, argv: tuple[str, ...] = ("nft",)) -> None:
            nfts.made += 1

        def status(self, plan: FirewallPlan | None) -> FirewallStatus:
            nfts.asked.append(("status", plan))
            return dict(nfts.answer)  # type: ignore[return-value]

        def apply(self, plan: FirewallPlan) -> None:
            nfts.asked.append(("apply", plan))
            if nfts.refuse:
                raise nfts.refuse

        def remove(self) -> bool:
            nfts.asked.append(("remove", None))
            if nfts.refuse:
                raise nfts.refuse
            return nfts.removed

    monkeypatch.setattr("llmgw.agent.firewall.Nft", FakeNft)
    yield nfts


@pytest.fixture
def able(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as root with nft installed, whatever it really is."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: f"/usr/sbin/{name}")


@pytest.fixture
def default_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The usual state dir, moved here (LLMGW_STATE_DIR)."""
    usual = tmp_path / "usual"
    usual.mkdir()
    monkeypatch.setenv("LLMGW_STATE_DIR", str(usual))
    return usual


# --- the state dir -------------------------------------------------------------------


def _args(given: str | None) -> argparse.Namespace:
    return argparse.Namespace(state_dir=given)


def test_state_dir_given_wins_over_agent_yaml(default_dir: Path, tmp_path: Path) -> None:
    (default_dir / "agent.yaml").write_text(f"state_dir: {tmp_path / 'elsewhere'}\n")
    assert state_dir(_args(str(tmp_path / "given"))) == tmp_path / "given"


def test_state_dir_is_the_one_the_usual_agent_yaml_names(default_dir: Path, tmp_path: Path) -> None:
    (default_dir / "agent.yaml").write_text(
        f"server: 10.0.0.1:8080\nstate_dir: {tmp_path / 'kept'}\n"
    )
    assert state_dir(_args(None)) == tmp_path / "kept"


def test_state_dir_is_the_usual_one_when_agent_yaml_names_none_or_is_absent(
    default_dir: Path,
) -> None:
    assert state_dir(_args(None)) == default_dir
    (default_dir / "agent.yaml").write_text("server: 10.0.0.1:8080\n")
    assert state_dir(_args(None)) == default_dir


def test_the_usual_state_dir_of_a_user_is_under_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert state_dir(_args(None)) == tmp_path / "xdg" / "llmgw-agent"


def test_a_broken_agent_yaml_is_said_and_exits_1(
    default_dir: Path, nfts: Nfts, capsys: pytest.CaptureFixture[str]
) -> None:
    (default_dir / "agent.yaml").write_text("state_dir: [unclosed\n")
    assert main(["firewall", "status"]) == 1
    assert capsys.readouterr().err.startswith(
        f"llmgw: {default_dir / 'agent.yaml'}: not valid YAML"
    )
    assert nfts.asked == []


def test_status_reads_the_plan_in_the_usual_dir_when_given_none(
    default_dir: Path, nfts: Nfts, capsys: pytest.CaptureFixture[str]
) -> None:
    save_plan(default_dir, PLAN)
    assert main(["firewall", "status", "--json"]) == 0
    assert nfts.asked == [("status", PLAN)]
    assert json.loads(capsys.readouterr().out)["plan"] == PLAN.to_map()


# --- status --------------------------------------------------------------------------


def test_status_without_a_plan_or_table(
    tmp_path: Path, nfts: Nfts, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["firewall", "status", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        f"No llmgw table; no plan from the control plane is saved ({tmp_path / STATE_FILE}).\n"
    )
    assert nfts.asked == [("status", None)]
    assert main(["firewall", "status", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**status(), "plan": None}


def test_status_compares_the_table_with_the_saved_plan(
    tmp_path: Path, nfts: Nfts, capsys: pytest.CaptureFixture[str]
) -> None:
    save_plan(tmp_path, PLAN)
    nfts.answer = status(present=True, in_sync=True, rules=RULES)
    assert main(["firewall", "status", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "llmgw's table (inet llmgw) is loaded; the control plane's plan asks for it; it matches.",
        "",
        *RULES,
    ]
    # The plan handed to nft is the one saved, read back whole.
    assert nfts.asked == [("status", PLAN)]
    assert main(["firewall", "status", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        **status(present=True, in_sync=True, rules=RULES),
        "plan": PLAN.to_map(),
    }


def test_status_with_a_problem_says_it_and_the_fix_and_exits_1(
    tmp_path: Path, nfts: Nfts, capsys: pytest.CaptureFixture[str]
) -> None:
    save_plan(tmp_path, PLAN)
    problem = "the table is absent; the plan wants it loaded"
    nfts.answer = status(in_sync=False, problem=problem)
    assert main(["firewall", "status", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "No llmgw table; the control plane's plan asks for it.",
        f"Problem: {problem}",
        "Fix: `llmgw firewall sync` loads the saved plan again",
    ]
    assert main(["firewall", "status", "--state-dir", str(tmp_path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problem"] == problem


def test_status_where_nft_cannot_read_says_so_and_exits_1(
    tmp_path: Path, nfts: Nfts, capsys: pytest.CaptureFixture[str]
) -> None:
    for problem in (
        "nft is not installed (Debian: nftables)",
        f"nft may not read the ruleset: {ROOT_NOTE}",
    ):
        nfts.answer = status(problem=problem, nft="not installed" not in problem)
        assert main(["firewall", "status", "--state-dir", str(tmp_path)]) == 1
        assert capsys.readouterr().out == f"llmgw's table cannot be read: {problem}\n"


def test_status_of_a_plan_that_turns_the_firewall_off(tmp_path: Path) -> None:
    off = FirewallPlan(enabled=False).to_map()
    path = tmp_path / STATE_FILE
    assert status_text(status(in_sync=True, plan=off), path) == (
        "No llmgw table; the control plane's plan says the firewall is off; it matches."
    )
    loaded = status(
        present=True,
        in_sync=False,
        problem="the table is loaded; the plan says it is off",
        plan=off,
    )
    assert status_text(loaded, path).splitlines() == [
        "llmgw's table (inet llmgw) is loaded; the control plane's plan says the firewall is off.",
        "Problem: the table is loaded; the plan says it is off",
        "Fix: `llmgw firewall sync` loads the saved plan again",
    ]


def test_a_table_without_a_saved_plan_is_shown_and_no_fix_offered(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    text = status_text(status(present=True, rules=RULES, plan=None), path)
    assert text.splitlines() == [
        f"llmgw's table (inet llmgw) is loaded; no plan from the control plane is saved ({path}).",
        "",
        *RULES,
    ]
    odd = status_text(status(present=True, in_sync=None, problem="odd", plan=None), path)
    assert "Fix:" not in odd


@pytest.mark.parametrize(
    ("written", "words"),
    [
        ("{not json", "cannot be read"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"networks": ["10.0.0.1/24"]}', "networks: '10.0.0.1/24' is not an address or CIDR"),
    ],
    ids=["not-json", "not-an-object", "a-bad-network"],
)
@pytest.mark.parametrize("command", ["status", "sync"])
def test_a_saved_plan_that_does_not_hold_is_refused_naming_the_file(
    written: str,
    words: str,
    command: str,
    tmp_path: Path,
    nfts: Nfts,
    able: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / STATE_FILE).write_text(written)
    assert main(["firewall", command, "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"llmgw: {tmp_path / STATE_FILE}") and words in err
    assert nfts.asked == []


# --- sync ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "euid", "words"),
    [
        (None, 0, "nft is not installed (Debian: apt install nftables); no table can be kept"),
        ("/usr/sbin/nft", 1000, f"not root: {ROOT_NOTE}; run this as root"),
        (None, 1000, "nft is not installed"),  # the first thing missing is said
    ],
    ids=["no-nft", "not-root", "neither"],
)
def test_sync_without_root_or_nft_says_why_and_changes_nothing(
    which: str | None,
    euid: int,
    words: str,
    tmp_path: Path,
    nfts: Nfts,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **kw: which)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    save_plan(tmp_path, PLAN)
    assert main(["firewall", "sync", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(f"llmgw: {words}")
    assert nfts.made == 0


def test_sync_without_a_saved_plan_changes_nothing(
    tmp_path: Path, nfts: Nfts, able: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["firewall", "sync", "--state-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"llmgw: no plan saved in {tmp_path / STATE_FILE}: the control plane has sent none "
        "to this node; nothing was changed\n"
    )
    assert nfts.made == 0


def test_sync_loads_the_saved_plan(
    tmp_path: Path, nfts: Nfts, able: None, capsys: pytest.CaptureFixture[str]
) -> None:
    save_plan(tmp_path, PLAN)
    assert main(["firewall", "sync", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        "llmgw's table (inet llmgw) loaded as the control plane's plan says\n"
    )
    assert nfts.asked == [("apply", PLAN)]


@pytest.mark.parametrize(
    ("removed", "said"),
    [
        (True, "the plan says the firewall is off: llmgw's table removed"),
        (False, "the plan says the firewall is off; there was no llmgw table"),
    ],
)
def test_sync_of_a_plan_that_turns_the_firewall_off_removes_the_table(
    removed: bool,
    said: str,
    tmp_path: Path,
    nfts: Nfts,
    able: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    save_plan(tmp_path, FirewallPlan(enabled=False))
    nfts.removed = removed
    assert main(["firewall", "sync", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == said + "\n"
    assert nfts.asked == [("remove", None)]


@pytest.mark.parametrize("enabled", [True, False])
def test_sync_that_nft_refuses_exits_1_with_its_words(
    enabled: bool,
    tmp_path: Path,
    nfts: Nfts,
    able: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    save_plan(tmp_path, FirewallPlan(enabled=enabled))
    nfts.refuse = FirewallError("nft refused llmgw's table: Error: syntax error")
    assert main(["firewall", "sync", "--state-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "llmgw: nft refused llmgw's table: Error: syntax error\n"


def test_firewall_without_a_subcommand_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["firewall"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert "status" in out and "sync" in out
