"""``llmgw server add`` against a real sshd on loopback and a real leader.

The machine the sshd reaches is this one, so the standby runs from the zipapp under the
python3 an ssh login finds, with its own ports, the way it would on a fresh machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, free_port, run
from tests.support.sshd import SSHD, Sshd, running_sshd


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.skip(f"{SSHD} is absent (Debian's openssh-server; `make apt` installs it)")
    with running_sshd(tmp_path / "sshd", free_port()) as server:
        yield server


def _is_ours(pid: int, prefix: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(prefix / "llmgw.pyz").encode() in cmdline


def _stop(prefix: Path) -> None:
    """The nohup'd control plane in ``prefix``, checked by its command line first."""
    try:
        pid = int((prefix / "server.pid").read_text().strip())
    except (OSError, ValueError):
        return
    if not _is_ours(pid, prefix):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _is_ours(pid, prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_ours(pid, prefix):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def prefixes(tmp_path: Path) -> Iterator[list[Path]]:
    """Install prefixes on the "new machine"; what runs from them is stopped afterwards
    (the cluster's own teardown then kills anything else under tmp_path)."""
    made: list[Path] = []
    yield made
    for prefix in made:
        _stop(prefix)


def _server_add(sshd: Sshd, cluster: Cluster, prefix: Path, zipapp: Path, *extra: str) -> Any:
    return run(
        "server",
        "add",
        "127.0.0.1",
        *sshd.ssh_args(),
        "--prefix",
        str(prefix),
        "--zipapp",
        str(zipapp),
        "--data-dir",
        str(cluster.data_dir),
        *extra,
        check=False,
        timeout=240,
    )


def _leader_answer(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/leader", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@pytest.mark.e2e
def test_server_add_makes_a_standby_that_the_leader_sees_answer(
    sshd: Sshd, cluster: Cluster, prefixes: list[Path], zipapp: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "cp-b"
    prefixes.append(prefix)
    http, agents, peers = free_port(), free_port(), free_port()
    ports = ["--listen", f"127.0.0.1:{http}", "--agent-port", str(agents)]
    ports += ["--peer-port", str(peers), "--timeout", "90"]
    proc = _server_add(sshd, cluster, prefix, zipapp, "--name", "cp-b", *ports)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    for step in (
        "==> looking at the machine",
        "==> asking the leader for a server token",
        "==> copying the zipapp",
        f"==> joining the cluster as cp-b, a standby of 127.0.0.1:{cluster.http_port}",
        "==> starting the control plane under nohup",
        "==> waiting for it to answer as a standby",
        "control plane cp-b answers as a standby of the leader",
    ):
        assert step in out, out
    assert "no systemd on 127.0.0.1" in out, "it says the start is not a service"
    assert "Joined the cluster as control plane cp-b" in out, "join's own words are shown"

    listed = json.loads(run("ctl", "servers", "--json", "--data-dir", str(cluster.data_dir)).stdout)
    cp_b = next(s for s in listed if s["name"] == "cp-b")
    assert (cp_b["answers"], cp_b["role"]) == (True, "standby")
    assert cp_b["api_address"] == f"127.0.0.1:{http}"
    assert cp_b["peer_address"] == f"127.0.0.1:{peers}"
    status, answer = _leader_answer(http)
    assert status == 503
    assert (answer["name"], answer["role"], answer["leader"]["name"]) == ("cp-b", "standby", "cp-a")

    # What it left there: the zipapp, a data dir of its own, the pid of what runs.
    assert (prefix / "llmgw.pyz").read_bytes() == zipapp.read_bytes()
    config = (prefix / "data" / "server.yaml").read_text()
    assert "role: standby" in config and f"leader: 127.0.0.1:{cluster.peer_port}" in config
    pid = int((prefix / "server.pid").read_text())
    assert _is_ours(pid, prefix)

    # Again on the same prefix: refused before a token is minted, saying what to do.
    again = _server_add(sshd, cluster, prefix, zipapp, "--name", "cp-c", *ports)
    assert again.returncode == 1
    assert "looking at the machine failed" in again.stderr
    assert f"127.0.0.1:{prefix}/data already holds a control plane's data dir" in again.stderr
    # A name the cluster has: refused, naming the fix.
    taken = _server_add(sshd, cluster, tmp_path / "cp-a2", zipapp, "--name", "cp-a", *ports)
    assert taken.returncode == 1
    assert "a control plane named cp-a is already part of the cluster" in taken.stderr
    assert not (tmp_path / "cp-a2" / "data").exists()
    assert _is_ours(pid, prefix), "the refusals left the standby running"


@pytest.mark.e2e
def test_a_control_plane_that_cannot_start_is_reported_with_its_log(
    sshd: Sshd, cluster: Cluster, prefixes: list[Path], zipapp: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "cp-b"
    prefixes.append(prefix)
    # Its HTTP port is taken: `server join` does not bind it, `server run` cannot.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _server_add(
            sshd,
            cluster,
            prefix,
            zipapp,
            "--name",
            "cp-b",
            "--listen",
            f"127.0.0.1:{port}",
            "--agent-port",
            str(free_port()),
            "--peer-port",
            str(free_port()),
            "--timeout",
            "60",
        )
    assert proc.returncode == 1, f"{proc.stdout}\n{proc.stderr}"
    err = proc.stderr
    assert "waiting for it to answer failed: the control plane on 127.0.0.1 exited" in err
    assert "its log on 127.0.0.1:" in err
    assert "address already in use" in err.lower(), err
