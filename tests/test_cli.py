"""The command line: every command has help, durations parse, bad input is one clear line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmgw import __version__
from llmgw.cli import build_parser, main, parse_duration

COMMANDS = [
    ["server", "init"],
    ["server", "run"],
    ["agent", "run"],
    ["node", "token"],
    ["node", "add"],
    ["ctl", "nodes"],
    ["ctl", "status"],
    ["doctor"],
]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"llmgw {__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert f"usage: llmgw {' '.join(command)}" in capsys.readouterr().out


def test_role_without_subcommand_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["server"])
    assert "init" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("1h", 3600), ("2d", 172800)]
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


def test_parse_duration_refuses() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        parse_duration("an hour")


def test_ctl_without_a_control_plane_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_SERVER", raising=False)
    monkeypatch.delenv("LLMGW_TOKEN", raising=False)
    assert main(["ctl", "nodes", "--data-dir", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "--server HOST:PORT" in err and "LLMGW_SERVER" in err and str(tmp_path) in err


def test_agent_without_enrollment_or_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent", "run", "--state-dir", str(tmp_path / "s")]) == 1
    assert "has not joined a cluster" in capsys.readouterr().err


def test_agent_with_damaged_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "agent",
                "run",
                "--state-dir",
                str(tmp_path),
                "--token",
                "llmgw-join-1.xx",
                "--server",
                "127.0.0.1:1",
            ]
        )
        == 1
    )
    assert "damaged" in capsys.readouterr().err


def test_agent_config_file_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("tokn: x\n")
    assert main(["agent", "run", "--config", str(cfg)]) == 1
    assert f"{cfg}: unknown key 'tokn'" in capsys.readouterr().err


def test_parser_builds() -> None:
    assert build_parser().prog == "llmgw"


def test_llmgw_py_at_the_top_runs_every_role_from_a_checkout(tmp_path: Path) -> None:
    import subprocess
    import sys

    launcher = Path(__file__).resolve().parent.parent / "llmgw.py"
    # From elsewhere, as `python3 /path/to/checkout/llmgw.py`: the package beside it runs.
    version = subprocess.run(
        [sys.executable, str(launcher), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"llmgw {__version__}"
    helped = subprocess.run(
        [sys.executable, str(launcher), "agent", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert helped.returncode == 0 and "run" in helped.stdout


def test_server_run_on_a_store_from_a_newer_llmgw_says_so_and_exits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    from llmgw.server.datadir import init

    root = tmp_path / "cp"
    init(root, listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"])
    with sqlite3.connect(root / "store.db") as db:
        db.execute("INSERT INTO schema_migrations VALUES (9999, 0.0)")
    db.close()
    assert main(["server", "run", "--data-dir", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llmgw: the store ") and "written by a newer llmgw" in err
    assert "Traceback" not in err
