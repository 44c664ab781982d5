"""FreeToken as PyPI ships it (``freetoken`` 0.2.1), installed for real with uv into
an environment kept in ``~/.cache/llmgw/`` (the first run installs it, about a minute;
later runs find it): its ``ft`` entry point says the version the adapter reads, every
flag its ``ft serve`` parser takes is one llmgw's rules know (refused, set by the
catalog, or let through), and its real ``/health`` bodies are read by the adapter's
readiness rule as FreeToken means them.

The environment is made without uv's ``--torch-backend`` (the node's installer passes
one, which reaches the PyTorch index: that path is tested with stand-in wheels in
``test_pyinstall.py``). Where the wheel cannot be installed on this machine (no
package index, not x86-64 Linux) the tests are skipped saying why.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from llmgw.agent.engines import adapter
from llmgw.agent.engines.pyinstall import find_uv
from llmgw.modelkit.enginerules import freetoken as flags

VERSION = "0.2.1"

# One Python run in the environment: the health bodies FreeToken's own build_health
# writes in each state, and the option strings its ft serve parser declares (read off
# the parser as parse_args builds it, which --help would print).
PROBE = r"""
import argparse, json, sys, types
from freetoken.server.control_api import build_health
from freetoken.server import args as server_args

def state(mode, fatal=None):
    return types.SimpleNamespace(
        instance_id="i", fatal_error=fatal, maintenance_state=mode, load_progress=None,
        config=types.SimpleNamespace(served_model_name="m"), ready_at=None)

health = {
    "loading": build_health(state("loading"), "0.2.1"),
    "serving": build_health(state("serving"), "0.2.1"),
    "failed": build_health(state("serving", fatal="worker 0 died"), "0.2.1"),
}
options = []
real_parse = argparse.ArgumentParser.parse_args

def capture(self, *a, **k):
    options.extend(self._option_string_actions)
    raise SystemExit(0)

argparse.ArgumentParser.parse_args = capture
try:
    server_args.parse_args(["--model-path", "x"])
except SystemExit:
    pass
print(json.dumps({"health": health, "options": sorted(set(options))}))
"""


def _environment() -> Path:
    """The ``ft`` entry point of a FreeToken environment, installed once; skips the
    test saying why when it cannot be."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip(f"FreeToken's wheels are for x86-64 Linux, this is {platform.machine()}")
    uv = find_uv()
    if uv is None:
        pytest.skip("uv is not beside this Python nor on PATH")
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = Path(os.environ.get("LLMGW_CACHE") or xdg / "llmgw")
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"freetoken-{VERSION}"
    ft = root / "venv" / "bin" / "ft"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
    with FileLock(str(cache / f"freetoken-{VERSION}.lock")):
        if (root / "installed").is_file() and ft.is_file():
            return ft
        steps = [
            [uv, "venv", "-q", "--clear", "--python", sys.executable, str(root / "venv")],
            [uv, "pip", "install", "-q", "--python", str(root / "venv" / "bin" / "python")]
            + [f"freetoken=={VERSION}"],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
            if done.returncode != 0:
                pytest.skip(f"freetoken {VERSION} cannot be installed here: {done.stderr[-400:]}")
        (root / "installed").write_text(VERSION + "\n")
    return ft


@pytest.fixture(scope="module")
def ft() -> Path:
    return _environment()


@pytest.fixture(scope="module")
def probe(ft: Path) -> dict[str, Any]:
    python = ft.with_name("python")
    done = subprocess.run(
        [str(python), "-c", PROBE], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_version_the_adapter_reads(ft: Path) -> None:
    engine = adapter("freetoken")
    done = subprocess.run(
        engine.version_command(str(ft)), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert engine.parse_version(done.stdout) == VERSION


def test_every_ft_serve_flag_is_known_to_the_rules(probe: dict[str, Any]) -> None:
    options = set(probe["options"])
    known = set(flags.OPTIONS) | set(flags.REFUSED) | set(flags.MANAGED)
    assert "--model-path" in options and "--moe-cache-split" in options
    # A flag FreeToken added that llmgw does not know would be judged by beginnings
    # as if absent: every one must be listed, and none listed that it lacks.
    assert options - known == set()
    assert known - options == set()


def test_readiness_reads_its_real_health_bodies(probe: dict[str, Any]) -> None:
    engine = adapter("freetoken")
    health = probe["health"]
    assert health["loading"]["status"] == "loading"
    assert not engine.ready(200, json.dumps(health["loading"]).encode())
    assert not engine.ready(200, json.dumps(health["failed"]).encode())
    assert engine.ready(200, json.dumps(health["serving"]).encode())
