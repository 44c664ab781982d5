"""The machine seam of ``llmgw wipe``: which processes are llmgw's, and stopping one
only while it is the process that was found."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from llmgw.wipe.machine import HostMachine, is_llmgw_daemon, process_facts, stop_process


@pytest.mark.parametrize(
    ("cmdline", "ours"),
    [
        (("python3", "/opt/llmgw/llmgw.pyz", "agent", "run", "--config", "x"), True),
        (("/usr/bin/python3", "-m", "llmgw", "server", "run"), True),
        (("/usr/local/bin/llmgw", "agent", "run"), True),
        (("/usr/local/bin/llmgw", "wipe"), False),
        (("python3", "-m", "other", "agent", "run"), False),
        (("vim", "llmgw-notes.txt", "agent", "run"), False),
    ],
)
def test_an_llmgw_daemon_is_known_by_its_command_line(cmdline: tuple[str, ...], ours: bool) -> None:
    assert is_llmgw_daemon(cmdline) is ours


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    # The shell stays (two commands): its command line is what names it llmgw's agent.
    proc = subprocess.Popen(["sh", "-c", "sleep 300; :", "llmgw.pyz", "agent", "run"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_host_finds_an_agent_by_its_command_line(sleeper: subprocess.Popen[bytes]) -> None:
    found = {f.pid for f in HostMachine().llmgw_daemons()}
    assert sleeper.pid in found


def test_a_process_is_stopped_only_while_it_is_the_one_found(
    sleeper: subprocess.Popen[bytes],
) -> None:
    facts = process_facts(sleeper.pid)
    assert facts is not None
    # Found earlier under the same pid but started at another time: another process.
    assert stop_process(replace(facts, create_time=facts.create_time - 60)) is None
    assert sleeper.poll() is None
    assert stop_process(facts, grace=5) is None
    assert sleeper.wait(timeout=10) == -15
