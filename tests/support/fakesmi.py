"""A stand-in ``nvidia-smi`` for the agent's card-reading tests: a shell script whose
answers the test writes, logging each run's arguments, and ``NvidiaCards`` over it with
NVML absent and the Xid log a file of the test's own (never this machine's /dev/kmsg)."""

from __future__ import annotations

import stat
from pathlib import Path

from llmgw.agent.discovery import FakeNvml, NvidiaCards
from llmgw.agent.discovery.xidwatch import XidWatch


def fake_smi(tmp_path: Path, body: str) -> Path:
    """An nvidia-smi stand-in; each run's arguments go, one run a line, to calls.log."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls.log"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(tmp_path: Path) -> list[str]:
    """The arguments of each run so far, one string a run."""
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def cards(tmp_path: Path, smi: Path) -> NvidiaCards:
    """The cards as the agent reads them with no NVML: through ``smi`` alone."""
    return NvidiaCards(
        FakeNvml(unavailable=True), str(smi), xids=XidWatch(tmp_path / "no-kmsg", boot=0.0)
    )
