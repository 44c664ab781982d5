"""Stopping the processes tests start: politely, then for sure, always reaped."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(popen: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """SIGTERM, SIGKILL after ``grace`` seconds; waits either way, so nothing lingers."""
    if popen.poll() is None:
        popen.terminate()
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(5)
