"""``llmgw service`` where systemd runs: ``systemctl`` asked for each unit's state and
told to start, stop or restart it.

This machine runs no systemd (no /run/systemd/system, no system bus), so the test points
the module's check at a folder of its own and puts a stand-in ``systemctl`` first on
PATH: it records its argv and answers ``show`` and ``is-active`` as systemd does (a
unit it has: ``LoadState=loaded``, ``ActiveState``, ``MainPID``; one it has not:
``LoadState=not-found``, ``MainPID=0``). The nohup installs' path runs for real in
the node add test (tests/e2e/test_node_add.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmgw import cli
from llmgw.client import service

SYSTEMCTL = """#!/bin/sh
echo "$@" >> {log}
unit=""
for a in "$@"; do case "$a" in *.service) unit="$a";; esac; done
state=$(cat {units}/"$unit" 2>/dev/null)
case "$1" in
  show)
    if [ -z "$state" ]; then
      printf 'MainPID=0\\nLoadState=not-found\\nActiveState=inactive\\n'
    elif [ "$state" = active ]; then
      printf 'MainPID=%s\\nLoadState=loaded\\nActiveState=active\\n' {pid}
    else
      printf 'MainPID=0\\nLoadState=loaded\\nActiveState=%s\\n' "$state"
    fi ;;
  is-active) echo "${{state:-inactive}}"; [ "$state" = active ] ;;
  start|restart) [ -n "$state" ] || {{ echo "Unit $unit not found." >&2; exit 5; }}
    echo active > {units}/"$unit" ;;
  stop) [ -z "$state" ] || echo inactive > {units}/"$unit" ;;
esac
"""


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    runs = tmp_path / "run-systemd-system"
    runs.mkdir()
    monkeypatch.setattr(service, "SYSTEMD_RUNS", runs)
    bin_dir, units, log = tmp_path / "bin", tmp_path / "units", tmp_path / "systemctl.argv"
    bin_dir.mkdir()
    units.mkdir()
    tool = bin_dir / "systemctl"
    # Its MainPID is this test's own process: a live pid, whose start psutil reads.
    tool.write_text(SYSTEMCTL.format(log=log, units=units, pid=os.getpid()))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return units, log


def shown(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert cli.main(["service", *argv, "--json"]) == 0
    out: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return out


def test_status_says_each_unit_of_this_machine(
    systemd: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    units, _ = systemd
    (units / "llmgw-agent.service").write_text("active\n")
    rows = {r["role"]: r for r in shown(capsys, "status")}
    agent, server = rows["agent"], rows["server"]
    assert (agent["unit"], agent["manager"], agent["state"]) == (
        "llmgw-agent.service",
        "systemd",
        "active",
    )
    assert agent["pid"] == os.getpid() and isinstance(agent["since"], float)
    assert agent["log"] == "journalctl -u llmgw-agent.service"
    assert (server["state"], server["pid"], server["since"]) == ("absent", None, None)


def test_stop_start_restart_ask_systemctl_for_the_units_installed(
    systemd: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    units, log = systemd
    (units / "llmgw-agent.service").write_text("active\n")
    (units / "llmgw-server.service").write_text("active\n")
    assert {r["state"] for r in shown(capsys, "stop")} == {"inactive"}
    assert [r["state"] for r in shown(capsys, "start", "--role", "agent")] == ["active"]
    assert [r["state"] for r in shown(capsys, "restart", "--role", "server")] == ["active"]
    asked = [line for line in log.read_text().splitlines() if not line.startswith("show")]
    # The agent stopped before its control plane; each unit by its name.
    assert asked == [
        "stop llmgw-agent.service",
        "stop llmgw-server.service",
        "start llmgw-agent.service",
        "restart llmgw-server.service",
    ]


def test_nothing_installed_is_said_with_what_installs_it(
    systemd: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, log = systemd
    assert cli.main(["service", "restart", "--role", "agent"]) == 1
    said = capsys.readouterr().err
    assert "no llmgw agent is installed here (systemd)" in said and "node add" in said
    assert not [line for line in log.read_text().splitlines() if not line.startswith("show")]


def test_a_failing_systemctl_is_said(
    systemd: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    units, _ = systemd
    (units / "llmgw-agent.service").write_text("failed\n")
    tool = tmp_path / "bin" / "systemctl"
    # A start that systemd refuses (polkit, a broken unit): its words come back.
    tool.write_text(
        tool.read_text().replace(
            "  start|restart)", '  start) echo "Access denied" >&2; exit 4 ;;\n  restart)'
        )
    )
    assert cli.main(["service", "start", "--role", "agent"]) == 1
    assert "systemctl start llmgw-agent.service: Access denied" in capsys.readouterr().err


def test_a_stop_kills_a_process_that_ignores_sigterm_so_no_start_runs_beside_it(
    tmp_path: Path,
) -> None:
    """The nohup stop waits its tenths after SIGTERM, then SIGKILLs: a start that came
    after a slow stop would otherwise run a second agent beside the first."""
    import subprocess
    import sys

    from llmgw.client.remote import stop_previous

    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(120)",
            str(tmp_path / "llmgw.pyz"),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"up\n"
        (tmp_path / "agent.pid").write_text(f"{stubborn.pid}\n")
        subprocess.run(["sh", "-c", stop_previous(str(tmp_path), "agent", 3)], check=True)
        # Gone (killed, not merely told), and its pid file with it.
        assert stubborn.wait(timeout=5) == -9
        assert not (tmp_path / "agent.pid").exists()
    finally:
        stubborn.kill()
        stubborn.wait()
        assert stubborn.stdout is not None
        stubborn.stdout.close()


@pytest.mark.parametrize(
    ("cmdline", "started"),
    [
        (["sh", "-c", "nohup python3 /opt/llmgw/llmgw.pyz agent run"], False),
        (["nohup", "python3", "/opt/llmgw/llmgw.pyz", "agent", "run"], False),
        ([], False),  # mid-exec: the command line reads empty
        (["python3", "/opt/llmgw/llmgw.pyz", "agent", "run"], True),
        (["python3", "/srv/other.py"], False),  # a reused pid
    ],
)
def test_a_start_is_said_done_once_the_fork_is_the_zipapps_python(
    monkeypatch: pytest.MonkeyPatch, cmdline: list[str], started: bool
) -> None:
    # CI saw `service restart` say the agent inactive: the start's wait ended while the
    # fork was still nohup (whose command line names llmgw.pyz), and the status after it
    # read the command line in the middle of the exec.
    class Process:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def cmdline(self) -> list[str]:
            return cmdline

    monkeypatch.setattr(service.psutil, "Process", Process)
    assert service._became_python(4242) is started
    assert service._became_python(0) is False
