"""``llmgw node add`` against a real sshd on loopback and a real control plane, and
``llmgw service`` on the install it leaves.

The sshd is Debian's, started by the test with its own host key and an authorized key
the test makes; the node it reaches is this machine, so the agent runs from the zipapp
under the python3 an ssh login finds, the way it would on a fresh node.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw import __version__, release
from llmgw.client import nodeadd, remote
from tests.e2e.cluster import Cluster, free_port, run, wait_for
from tests.support import releases
from tests.support.releases import ReleaseServer, publish, versioned_zipapp
from tests.support.sshd import SSHD, Sshd, running_sshd


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.skip(f"{SSHD} is absent (Debian's openssh-server; `make apt` installs it)")
    with running_sshd(tmp_path / "sshd", free_port()) as server:
        yield server


def _agent_pid(prefix: Path) -> int | None:
    try:
        return int((prefix / "agent.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _is_agent(pid: int, prefix: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return str(prefix / "llmgw.pyz").encode() in cmdline


def _stop_agent(pid: int | None, prefix: Path) -> None:
    # Checked against its command line: a pid left in the file may have been reused.
    if pid is None or not _is_agent(pid, prefix):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _is_agent(pid, prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_agent(pid, prefix):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def prefix(tmp_path: Path) -> Iterator[Path]:
    """The node's install prefix; the nohup'd agent left in it is stopped afterwards."""
    path = tmp_path / "prefix"
    yield path
    _stop_agent(_agent_pid(path), path)


def _nodes(cluster: Cluster) -> dict[str, dict[str, Any]]:
    out = run("ctl", "nodes", "--json", "--data-dir", str(cluster.data_dir)).stdout
    return {n["id"]: n for n in json.loads(out)}


@pytest.mark.e2e
def test_node_add_installs_and_starts_an_agent_that_goes_ready(
    sshd: Sshd, cluster: Cluster, prefix: Path, zipapp: Path
) -> None:
    args = sshd.node_add_args(
        "--prefix",
        str(prefix),
        "--node-id",
        "addtest",
        "--zipapp",
        str(zipapp),
        "--timeout",
        "60",
        "--data-dir",
        str(cluster.data_dir),
    )
    proc = run(*args, check=False, timeout=180)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "node addtest is Ready" in proc.stdout
    # No systemd in the test's container: it must say so, not pretend.
    assert "no systemd on 127.0.0.1: starting the agent under nohup" in proc.stdout
    assert "running `llmgw doctor`" in proc.stdout

    node = _nodes(cluster)["addtest"]
    assert node["state"] == "Ready"
    assert node["connected"] is True

    # What it left on the node.
    assert (prefix / "llmgw.pyz").read_bytes() == zipapp.read_bytes()
    config = (prefix / "agent.yaml").read_text()
    assert (prefix / "agent.yaml").stat().st_mode & 0o077 == 0, "agent.yaml holds the token"
    assert f"state_dir: {prefix}/state" in config
    assert "node_id: addtest" in config
    assert f"server: 127.0.0.1:{cluster.http_port}" in config
    assert "token: llmgw-join-1." in config
    assert (prefix / "state" / "node.crt").exists()
    first = _agent_pid(prefix)
    assert first is not None and _is_agent(first, prefix)
    # The agent runs from the zipapp, not from this test's virtual environment.
    exe = os.readlink(f"/proc/{first}/exe")
    assert not Path(exe).is_relative_to(Path(sys.prefix))

    # Adding it again replaces the agent rather than starting a second one.
    try:
        again = run(*args, check=False, timeout=180)
        assert again.returncode == 0, f"{again.stdout}\n{again.stderr}"
        second = _agent_pid(prefix)
        assert second is not None and second != first and _is_agent(second, prefix)
        assert not _is_agent(first, prefix)
        assert _nodes(cluster)["addtest"]["state"] == "Ready"
        installed_runs_as_a_service(cluster, prefix, second)
    finally:
        _stop_agent(first, prefix)


def installed_runs_as_a_service(cluster: Cluster, prefix: Path, pid: int) -> None:
    """``llmgw service`` on the install node add left without systemd: its status, then
    restart, stop and start, each seen by its status and by the control plane."""

    def service(*argv: str) -> Any:
        done = run("service", *argv, "--role", "agent", "--prefix", str(prefix), "--json")
        (row,) = json.loads(done.stdout)
        return row

    def registrations() -> int:
        return (prefix / "agent.log").read_text().count("registered with")

    status = service("status")
    assert (status["state"], status["manager"], status["pid"]) == ("active", "nohup", pid)
    assert status["unit"] == str(prefix / "agent.pid") and status["since"] is not None
    assert service("start")["pid"] == pid  # started already: a start changes nothing

    seen = registrations()
    again = service("restart")
    assert again["state"] == "active" and _is_agent(again["pid"], prefix)
    assert again["pid"] != pid and not _is_agent(pid, prefix)
    wait_for(lambda: registrations() > seen, 60, "the restarted agent to register")

    stopped = service("stop")
    assert (stopped["state"], stopped["pid"]) == ("inactive", None)
    assert not (prefix / "agent.pid").exists() and not _is_agent(again["pid"], prefix)
    text = run("service", "status", "--role", "agent", "--prefix", str(prefix)).stdout
    assert f"agent   {prefix / 'agent.pid'}: inactive (log: {prefix}/agent.log)" in text

    seen = registrations()
    started = service("start")
    assert started["state"] == "active" and _is_agent(started["pid"], prefix)
    wait_for(lambda: registrations() > seen, 60, "the started agent to register")
    cluster.wait_state("addtest", "Ready", 30)


@pytest.mark.e2e
def test_node_add_installs_the_release_the_control_plane_names_and_refuses_a_forged_one(
    sshd: Sshd, prefix: Path, zipapp: Path, tmp_path: Path
) -> None:
    """The operator's llmgw is a release (it trusts the test's key alone); the control
    plane names its own version and, in server.yaml, a loopback release source. A source
    whose SHA256SUMS another key signed is refused before anything reaches the node; the
    named one is fetched, checked, copied as it was published, and its agent goes Ready."""
    pem, public = releases.signing_key()
    operator = versioned_zipapp(zipapp, __version__, public, tmp_path / "operator" / "llmgw.pyz")
    # The release: the same llmgw, its bytes apart from the operator's own and the suite's,
    # so what lands on the node can only be the one fetched.
    with zipfile.ZipFile(zipapp) as zf:
        main = zf.read("__main__.py").decode() + "\n# the release\n"
    built = versioned_zipapp(zipapp, __version__, public, tmp_path / "built.pyz", main=main)
    tag = release.platform_tag()
    published = publish(tmp_path / "good", __version__, {tag: built}, pem)
    publish(tmp_path / "forged", __version__, {tag: built}, pem, tamper="signature")
    asset = published / release.asset_name(__version__, tag)
    assert asset.read_bytes() not in (zipapp.read_bytes(), operator.read_bytes())

    with (
        ReleaseServer(tmp_path / "good").running() as good,
        ReleaseServer(tmp_path / "forged").running() as forged,
    ):
        cluster = Cluster(tmp_path / "cluster")
        cluster.init()
        config = cluster.data_dir / "server.yaml"
        config.write_text(config.read_text() + f"releases:\n  source: {good.url}\n")
        cluster.start_server()
        env = {**os.environ, "SHIV_ROOT": str(tmp_path / "shiv")}

        def node_add(*extra: str) -> subprocess.CompletedProcess[str]:
            args = sshd.node_add_args(
                "--prefix", str(prefix), "--node-id", "fromrelease", "--timeout", "60",
                "--data-dir", str(cluster.data_dir), *extra,
            )  # fmt: skip
            return subprocess.run(
                ["python3", str(operator), *args],
                capture_output=True,
                text=True,
                timeout=180,
                env=env,
            )

        try:
            refused = node_add("--source", forged.url)
            assert refused.returncode == 1, f"{refused.stdout}\n{refused.stderr}"
            assert f"llmgw {__version__} for {tag} from {forged.url} was refused" in refused.stderr
            assert "not signed by a key this llmgw trusts" in refused.stderr
            assert "Nothing was copied to 127.0.0.1" in refused.stderr
            assert not prefix.exists(), "nothing reached the node"
            assert not any(r.endswith(".pyz") for r in forged.requests)

            proc = node_add()
            assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
            assert f"fetching llmgw {__version__} for {tag} from {good.url}" in proc.stdout
            assert "node fromrelease is Ready" in proc.stdout
            assert f"/download/v{__version__}/{asset.name}" in good.requests
            assert (prefix / "llmgw.pyz").read_bytes() == asset.read_bytes()
            node = _nodes(cluster)["fromrelease"]
            assert (node["state"], node["connected"], node["version"]) == (
                "Ready",
                True,
                __version__,
            )
        finally:
            cluster.stop()


@pytest.mark.e2e
def test_node_add_to_a_closed_ssh_port_names_ssh(
    cluster: Cluster, tmp_path: Path, zipapp: Path
) -> None:
    closed = free_port()
    proc = run(
        "node",
        "add",
        "127.0.0.1",
        "--user",
        getpass.getuser(),
        "--ssh-port",
        str(closed),
        "--prefix",
        str(tmp_path / "never"),
        "--zipapp",
        str(zipapp),
        "--data-dir",
        str(cluster.data_dir),
        check=False,
        timeout=60,
    )
    assert proc.returncode == 1
    assert f"ssh to {getpass.getuser()}@127.0.0.1 port {closed} failed" in proc.stderr
    assert "Connection refused" in proc.stderr
    assert f"ssh -p {closed} " in proc.stderr, "it says how to try the login by hand"
    assert not (tmp_path / "never").exists()


# --- the pieces without ssh -----------------------------------------------------------


PROBE = """\
uid=0
hostname=gpu-07.lab.example
machine=x86_64
python=3.11.2
systemd=yes
sudo=no
"""


def test_probe_output_is_read_into_facts() -> None:
    facts = remote.parse_probe(PROBE)
    assert facts == remote.NodeFacts(
        hostname="gpu-07",
        uid=0,
        machine="x86_64",
        python=(3, 11),
        python_text="3.11.2",
        systemd=True,
        sudo=False,
    )


@pytest.mark.parametrize(
    ("python_line", "message"),
    [
        ("python=", "has no working python3"),
        ("python=sh: 1: python3: Permission denied", "python3 said: sh: 1"),
        ("python=3.9.2", "has Python 3.9.2; llmgw needs 3.11 or newer"),
    ],
)
def test_a_node_without_a_usable_python_is_refused(python_line: str, message: str) -> None:
    facts = remote.parse_probe(PROBE.replace("python=3.11.2", python_line))
    with pytest.raises(remote.NodeAddError, match=message):
        remote.check_node(facts, "gpu-07", None)


def test_a_node_unlike_the_zipapps_compiled_modules_is_refused() -> None:
    facts = remote.parse_probe(PROBE.replace("python=3.11.2", "python=3.12.1"))
    with pytest.raises(remote.NodeAddError, match="for CPython 3.11 on x86_64"):
        remote.check_node(facts, "gpu-07", ((3, 11), "x86_64"))
    arm = remote.parse_probe(PROBE.replace("machine=x86_64", "machine=aarch64"))
    with pytest.raises(remote.NodeAddError, match="on aarch64"):
        remote.check_node(arm, "gpu-07", ((3, 11), "x86_64"))
    remote.check_node(remote.parse_probe(PROBE), "gpu-07", ((3, 11), "x86_64"))


def test_compiled_for_reads_the_zipapps_extension_modules(tmp_path: Path) -> None:
    pyz = tmp_path / "app.pyz"
    with zipfile.ZipFile(pyz, "w") as zf:
        zf.writestr("site-packages/msgpack/_cmsgpack.cpython-311-x86_64-linux-gnu.so", b"")
        zf.writestr("site-packages/llmgw/cli.py", b"")
    assert remote.compiled_for(pyz) == ((3, 11), "x86_64")


def test_without_a_zipapp_it_says_to_run_make_zipapp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "__file__", str(tmp_path / "llmgw" / "client" / "remote.py"))
    with pytest.raises(remote.NodeAddError, match="run `make zipapp`"):
        remote.find_zipapp(None, argv0="/usr/bin/llmgw")
    running = tmp_path / "llmgw.pyz"
    running.write_bytes(b"")
    assert remote.find_zipapp(None, argv0=str(running)) == running
    # Installed under another name, it is still recognised by its contents.
    installed = tmp_path / "llmgw"
    with zipfile.ZipFile(installed, "w") as zf:
        zf.writestr("environment.json", "{}")
        zf.writestr("__main__.py", "")
    assert remote.find_zipapp(None, argv0=str(installed)) == installed
    installed.write_text("#!/bin/sh\n")
    with pytest.raises(remote.NodeAddError, match="run `make zipapp`"):
        remote.find_zipapp(None, argv0=str(installed))
    with pytest.raises(remote.NodeAddError, match="no such file"):
        remote.find_zipapp(str(tmp_path / "missing.pyz"))


def test_with_systemd_the_python3_on_its_path_is_the_one_checked() -> None:
    # pyenv and the like change only a login's PATH; the unit would find another python3.
    facts = remote.parse_probe(PROBE + "unit_python=3.9.2\n")
    remote.check_node(facts, "gpu-07", None, systemd=False)
    with pytest.raises(remote.NodeAddError, match="on systemd's PATH.*has Python 3.9.2"):
        remote.check_node(facts, "gpu-07", None, systemd=True)


@pytest.mark.parametrize(
    "script",
    [
        remote.PROBE_SCRIPT,
        remote.copy_script("/opt/llm gw", "ab" * 32),
        remote.config_script("/opt/llmgw"),
        nodeadd.start_script("/opt/llmgw", systemd=True),
        nodeadd.start_script("/opt/llmgw", systemd=False),
    ],
    ids=["probe", "copy", "config", "start-systemd", "start-nohup"],
)
def test_the_remote_scripts_are_valid_posix_shell(script: str) -> None:
    # The systemd branch never runs in CI (no systemd here): parse it at least.
    for shell in ("sh", "dash", "bash"):
        found = shutil.which(shell)
        if found:
            proc = subprocess.run([found, "-n"], input=script, capture_output=True, text=True)
            assert proc.returncode == 0, f"{shell}: {proc.stderr}"


def test_the_systemd_unit_restarts_the_agent_from_the_prefix() -> None:
    unit = nodeadd.systemd_unit("/opt/llmgw")
    assert (
        "ExecStart=/usr/bin/env python3 /opt/llmgw/llmgw.pyz agent run "
        "--config /opt/llmgw/agent.yaml" in unit
    )
    assert "Restart=always" in unit and "RestartSec=2" in unit
    assert "WantedBy=multi-user.target" in unit


def test_agent_yaml_loads_as_agent_config(tmp_path: Path) -> None:
    from llmgw.config import AgentConfig, load

    path = tmp_path / "agent.yaml"
    path.write_text(nodeadd.agent_yaml("10.0.0.1:8080", "llmgw-join-1.x", "n1", "/opt/llmgw"))
    config = load(AgentConfig, path)
    assert (config.server, config.token, config.node_id, config.state_dir) == (
        "10.0.0.1:8080",
        "llmgw-join-1.x",
        "n1",
        "/opt/llmgw/state",
    )


def test_doctor_warnings_are_shown_and_a_missing_doctor_is_not_fatal() -> None:
    checks = [
        {"name": "cpu", "status": "ok", "detail": "fine", "fix": None},
        {"name": "clock", "status": "warn", "detail": "unsynced", "fix": "run chrony"},
    ]
    shown = nodeadd.doctor_report(remote.RemoteResult(0, json.dumps(checks), ""))
    assert shown == ["WARN clock: unsynced (fix: run chrony)"]
    missing = remote.RemoteResult(1, "", "ModuleNotFoundError: No module named 'x'")
    assert nodeadd.doctor_report(missing) == [
        "doctor did not run cleanly (ModuleNotFoundError: No module named 'x'); carrying on"
    ]


def test_a_relative_prefix_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argparse.Namespace(prefix="llmgw", host="n1")
    assert nodeadd.add_node(args, client=None) == 1  # type: ignore[arg-type]
    assert "--prefix 'llmgw': use an absolute path" in capsys.readouterr().err
