"""The zipapp runs on a node's own python3, with no virtual environment in sight."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from llmgw import __version__
from tests.support.procs import stop_process

pytestmark = pytest.mark.e2e

# What a fresh node has: the system's directories, nothing of the venv, no PYTHONPATH.
SYSTEM_PATH = "/usr/bin:/bin"


def _system_python() -> str:
    found = shutil.which("python3", path=SYSTEM_PATH)
    if found is None:
        pytest.fail(f"no python3 in {SYSTEM_PATH}: the zipapp needs the system's Python 3.11")
    return found


def _bare_env(home: Path) -> dict[str, str]:
    # HOME is ours so shiv unpacks under the test's temp dir, not the user's home.
    return {"PATH": SYSTEM_PATH, "HOME": str(home)}


def _run_pyz(
    pyz: Path, home: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(pyz), *args],
        env=_bare_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_version_runs_under_the_shebang_with_a_bare_environment(
    zipapp: Path, tmp_path: Path
) -> None:
    # Executed directly: the shebang (/usr/bin/env python3) has to find the system Python.
    proc = _run_pyz(zipapp, tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"llmgw {__version__}"


def test_version_runs_with_the_system_python(zipapp: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [_system_python(), str(zipapp), "--version"],
        env=_bare_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"llmgw {__version__}"


def test_agent_run_help(zipapp: Path, tmp_path: Path) -> None:
    proc = _run_pyz(zipapp, tmp_path, "agent", "run", "--help")
    assert proc.returncode == 0, proc.stderr
    for flag in ("--server", "--token", "--state-dir", "--node-id", "--config"):
        assert flag in proc.stdout


def test_doctor_answers_in_json(zipapp: Path, tmp_path: Path) -> None:
    proc = _run_pyz(zipapp, tmp_path, "doctor", "--json", "--state-dir", str(tmp_path / "s"))
    assert "Traceback" not in proc.stderr, proc.stderr
    checks = json.loads(proc.stdout)
    assert checks and all("status" in c for c in checks)


def test_console_runs_from_the_zipapp(zipapp: Path, tmp_path: Path) -> None:
    proc = _run_pyz(zipapp, tmp_path, "console", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: llmgw console" in proc.stdout
    # The console's styles come from inside the pyz, through importlib.resources, and the
    # setup forms' with them.
    script = (
        "import json, llmgw.tui.app as a, llmgw.tui.setup as s, llmgw.tui.nodeadd as n; "
        "print(json.dumps([a.__file__, a.ConsoleApp.CSS, s.SetupApp.CSS, n.NodeAddApp.CSS]))"
    )
    proc = subprocess.run(
        [_system_python(), str(zipapp), "-c", script],
        env={**_bare_env(tmp_path), "SHIV_INTERPRETER": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    where, console_css, setup_css, node_add_css = json.loads(proc.stdout)
    # Loaded from what shiv unpacked under HOME, not from this checkout.
    assert Path(where).is_relative_to(tmp_path), where
    assert "#sidebar" in console_css
    assert console_css in setup_css and console_css in node_add_css


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_init_and_run_answer_health(zipapp: Path, tmp_path: Path) -> None:
    # The control plane's web stack (aiohttp, starlette, aiosqlite) must be in the pyz.
    data_dir = tmp_path / "cp"
    http_port = _free_port()
    proc = _run_pyz(
        zipapp,
        tmp_path,
        "server",
        "init",
        "--data-dir",
        str(data_dir),
        "--listen",
        f"127.0.0.1:{http_port}",
        "--agent-port",
        str(_free_port()),
        # Not the default 8444: another test's control plane may hold it meanwhile.
        "--peer-port",
        str(_free_port()),
        "--yes",
    )
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [str(zipapp), "server", "run", "--data-dir", str(data_dir)],
        env=_bare_env(tmp_path),
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{http_port}/healthz", timeout=2
                ) as resp:
                    assert json.loads(resp.read())["ok"] is True
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        stop_process(server, grace=10)


def test_no_venv_leaks_into_the_bare_environment(tmp_path: Path) -> None:
    # Guards the guard: the environment above really is free of the test's venv.
    env = _bare_env(tmp_path)
    assert "VIRTUAL_ENV" not in env and "PYTHONPATH" not in env
    python = _system_python()
    proc = subprocess.run(
        [python, "-c", "import sys; print(sys.prefix == sys.base_prefix)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.stdout.strip() == "True"
    assert not Path(python).resolve().is_relative_to(Path(sys.prefix).resolve())
