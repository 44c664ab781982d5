"""What every role's command line shares: durations read as seconds (a bare number is
seconds; s, m, h, d), anything else refused as argparse refuses a value, naming it; and
``UsageError``, bad input printed without a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from llmgw.cliargs import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 30 * 60),
        ("1h", 3600),
        ("2d", 2 * 86400),
        ("0", 0),
        (" 15 m ", 15 * 60),
        ("007h", 7 * 3600),
    ],
)
def test_a_duration_is_read_as_seconds(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1.5h", "-1m", "1w", "1H", "1h30m", "ten", "1 hour"])
def test_anything_else_is_refused_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_duration(text)
    assert str(refused.value) == f"{text!r} is not a duration (like 30m, 1h, 2d)"


def test_argparse_turns_a_bad_duration_into_its_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="llmgw node token")
    parser.add_argument("--ttl", type=parse_duration, default="1h")
    assert parser.parse_args([]).ttl == 3600
    assert parser.parse_args(["--ttl", "2d"]).ttl == 2 * 86400
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--ttl", "soon"])
    assert exited.value.code == 2
    assert "argument --ttl: 'soon' is not a duration" in capsys.readouterr().err


def test_a_usage_error_is_said_in_one_line_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmgw.cli import main

    root = tmp_path / "data"
    assert main(["server", "init", "--data-dir", str(root), "--dsn", "host=db1"]) == 1
    err = capsys.readouterr().err
    assert err == "llmgw: --dsn goes with --store postgres\n"
    assert not root.exists()
