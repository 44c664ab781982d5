"""``server add --vip``'s keepalived configuration, run by real keepalived.

Two network namespaces joined by a veth pair stand for two control planes' machines. In
each, keepalived runs the configuration ``keepalived_conf`` writes, and a stand-in for the
control plane answers ``GET /leader`` on loopback (200 or 503, as a file says): the
address must follow the answer.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.client.keepalived import keepalived_conf, parse_vip
from tests.e2e.cluster import wait_for
from tests.support.procs import stop_process

VIP = "10.213.7.100"
PORT = 18080
LEADER_PY = """\
import http.server, pathlib, sys

role = pathlib.Path(sys.argv[2])


class Leader(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        leads = role.read_text().strip() == "leader"
        self.send_response(200 if leads else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Leader).serve_forever()
"""


@dataclass
class Machine:
    netns: str
    interface: str
    role: Path
    log: Path
    procs: list[subprocess.Popen[bytes]]

    def lead(self, leads: bool) -> None:
        self.role.write_text("leader" if leads else "standby")

    def holds_vip(self) -> bool:
        out = subprocess.run(
            ["ip", "-n", self.netns, "-4", "addr", "show", "dev", self.interface],
            capture_output=True,
            text=True,
        ).stdout
        return f"inet {VIP}/" in out

    def spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as fh:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, *argv],
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(popen)
        return popen


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[tuple[Machine, Machine]]:
    keepalived = shutil.which("keepalived") or "/usr/sbin/keepalived"
    if not Path(keepalived).exists():
        pytest.fail("keepalived is absent: `make test` installs it (Debian's keepalived)")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = secrets.token_hex(3)
    made: list[Machine] = []
    try:
        for side in "ab":
            netns = f"llmgw-vip-{side}-{tag}"
            try:
                _ip("netns", "add", netns)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
            role = tmp_path / f"role-{side}"
            role.write_text("standby")
            made.append(Machine(netns, f"lgw{side}{tag}", role, tmp_path / f"ka-{side}.log", []))
            _ip("-n", netns, "link", "set", "lo", "up")
        a, b = made
        _ip("link", "add", a.interface, "type", "veth", "peer", "name", b.interface)
        for i, m in enumerate(made):
            _ip("link", "set", m.interface, "netns", m.netns)
            _ip("-n", m.netns, "addr", "add", f"10.213.7.{i + 1}/24", "dev", m.interface)
            _ip("-n", m.netns, "link", "set", m.interface, "up")
            leader_py = tmp_path / "leader.py"
            leader_py.write_text(LEADER_PY)
            m.spawn([sys.executable, str(leader_py), str(PORT), str(m.role)], tmp_path / "srv.log")
            vip = parse_vip(f"{VIP}/24", m.interface, router_id=77)
            conf = tmp_path / f"keepalived-{m.netns}.conf"
            url = f"http://127.0.0.1:{PORT}/leader"
            conf.write_text(keepalived_conf(vip, name=f"cp-{'ab'[i]}", check_url=url))
            run = [keepalived, "--dont-fork", "--log-console", "--vrrp", "-f", str(conf)]
            run += ["-p", str(tmp_path / f"{m.netns}.pid"), "-r", str(tmp_path / f"{m.netns}.vpid")]
            m.spawn(run, m.log)
        yield a, b
    finally:
        for m in made:
            for p in reversed(m.procs):
                stop_process(p)
            subprocess.run(["ip", "netns", "del", m.netns], capture_output=True)


def _where(a: Machine, b: Machine) -> str:
    return "".join(name for name, m in (("a", a), ("b", b)) if m.holds_vip())


@pytest.mark.e2e
def test_the_address_follows_the_leader(machines: tuple[Machine, Machine]) -> None:
    a, b = machines
    a.lead(True)
    wait_for(lambda: _where(a, b) == "a", 20, "the address on the leader a")

    # b is promoted, a follows it: the address moves although a's keepalived still runs.
    a.lead(False)
    b.lead(True)
    wait_for(lambda: _where(a, b) == "b", 20, "the address to follow the leader to b")

    # b's machine goes away: a standby takes the address (it serves /v1 from its copy),
    # and keeps it once it is promoted.
    b.lead(False)
    stop_process(b.procs[-1])
    wait_for(lambda: _where(a, b) == "a", 20, "a standby to take the address")
    passes = "priority from 100 to 150"
    before = a.log.read_text().count(passes)
    a.lead(True)
    wait_for(lambda: a.log.read_text().count(passes) > before, 20, "a's check to pass again")
    assert _where(a, b) == "a"

    logs = a.log.read_text() + b.log.read_text()
    for bad in ("SECURITY VIOLATION", "Unknown keyword", "WARNING"):
        assert bad not in logs, logs
