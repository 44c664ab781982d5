"""The firewall's whole path: server.yaml, the control plane's ``Firewall`` message, the
agent's table loaded by real nft, and real connections to a real engine.

Three network namespaces stand for a control plane's machine (``cp``), a node and a
machine outside: ``cp`` and the node are joined by one veth pair (10.213.50.0/24), the
node and the outside by another (10.213.51.0/24). A third pair joins this machine to
``cp`` (10.213.52.0/24, with a route to the control plane's address) only so that the
test can call the admin API. The control plane runs in ``cp`` with the firewall on, the
agent as root in the node, and a llama-server shard on an engine port: only the control
plane may reach it; then the firewall is turned off and the table goes.

A refused connection is seen as such (a TCP reset comes back at once), so no test
waits to show that something did not happen.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, engine_ports, wait_for
from tests.e2e.test_shards import wait_replica
from tests.support.netns import ip, reach, run_in
from tests.support.procs import stop_process

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CP, NODE_CP = "10.213.50.1", "10.213.50.2"
NODE_OUT, OUT = "10.213.51.1", "10.213.51.2"
HOST, CP_HOST = "10.213.52.1", "10.213.52.2"
ENGINE_PORTS = "42300-42399"
ENGINE_PORT = 42342
OTHER_PORT = 8099  # not an engine port: the machine's own business


@dataclass
class Net:
    node: str
    cp: str
    out: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @staticmethod
    def prefix(netns: str) -> list[str]:
        return ["ip", "netns", "exec", netns]

    def reach(self, netns: str, host: str, port: int) -> str:
        """answered / refused / timeout: an HTTP GET from ``netns``, as it went."""
        return reach(netns, host, port, "/health")

    def in_node(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run_in(self.node, *argv)

    def status(self, state_dir: Path) -> dict[str, Any]:
        """``llmgw firewall status --json`` run in the node, for the agent's state dir."""
        llmgw = [sys.executable, "-m", "llmgw", "firewall", "status"]
        shown = self.in_node(*llmgw, "--state-dir", str(state_dir), "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr  # 1: a problem
        return json.loads(shown.stdout)  # type: ignore[no-any-return]

    def table(self) -> str | None:
        """llmgw's table in the node as nft lists it; None when there is none."""
        listed = self.in_node("nft", "list", "table", "inet", "llmgw")
        return listed.stdout if listed.returncode == 0 else None


@pytest.fixture
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces and nftables need root")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("needs iproute2 (`ip netns`) and nftables (`nft`)")
    pid = os.getpid()
    net = Net(f"llmgw-fwe-node-{pid}", f"llmgw-fwe-cp-{pid}", f"llmgw-fwe-out-{pid}")
    # (this end, its namespace, its address; the peer end's namespace, its address):
    # None is this machine's namespace.
    pairs: tuple[tuple[str, str | None, str, str, str], ...] = (
        (f"fwe{pid}c", net.node, NODE_CP, net.cp, CP),
        (f"fwe{pid}o", net.node, NODE_OUT, net.out, OUT),
        (f"fwe{pid}h", None, HOST, net.cp, CP_HOST),
    )
    made: list[str] = []
    try:
        for netns in (net.node, net.cp, net.out):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)  # a stale one
            try:
                ip("netns", "add", netns)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
            made.append(netns)
            ip("-n", netns, "link", "set", "lo", "up")
        listed = net.in_node("nft", "list", "tables")
        if listed.returncode != 0:
            pytest.skip(f"nft cannot work in a network namespace here: {listed.stderr.strip()}")
        for link, side, address, other, other_address in pairs:
            peer = link + "p"
            subprocess.run(["ip", "link", "del", link], capture_output=True)  # a stale one
            ip("link", "add", link, "type", "veth", "peer", "name", peer)
            ends: tuple[tuple[str, str | None, str], ...] = (
                (link, side, address),
                (peer, other, other_address),
            )
            for name, where, addr in ends:
                inside = ["-n", where] if where else []
                if where:
                    ip("link", "set", name, "netns", where)
                ip(*inside, "addr", "add", f"{addr}/24", "dev", name)
                ip(*inside, "link", "set", name, "up")
        # This machine reaches the control plane's address through cp's third link.
        ip("route", "replace", f"{CP}/32", "via", CP_HOST, "dev", pairs[2][0])
        serve = [sys.executable, "-m", "http.server", str(OTHER_PORT), "--bind", "0.0.0.0"]
        net.procs.append(
            subprocess.Popen(
                [*net.prefix(net.node), *serve],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=REPO / "tests",
            )
        )
        wait_for(
            lambda: net.reach(net.node, "127.0.0.1", OTHER_PORT) == "answered",
            20,
            f"the listener on {OTHER_PORT} in the node's namespace",
        )
        yield net
    finally:
        for proc in net.procs:
            stop_process(proc)
        for netns in made:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        for link, *_ in pairs:  # this machine's end, and any never moved into a namespace
            subprocess.run(["ip", "link", "del", link], capture_output=True)


def _firewall(config: Path, enabled: bool) -> None:
    """Turn the firewall on or off in server.yaml (Cluster writes it off)."""
    text = config.read_text()
    on, off = "firewall:\n  enabled: true", "firewall:\n  enabled: false"
    old, new = (off, on) if enabled else (on, off)
    assert old in text, text
    config.write_text(text.replace(old, new))


def test_engine_ports_answer_only_the_control_plane_until_turned_off(
    net: Net, tmp_path: Path, binary: Path, model: Path
) -> None:
    cluster = Cluster(tmp_path, host=CP, server_prefix=net.prefix(net.cp))
    try:
        cluster.init()
        config = cluster.data_dir / "server.yaml"
        text = config.read_text()
        assert f"engine_ports: {engine_ports()}" in text, text
        config.write_text(
            text.replace(f"engine_ports: {engine_ports()}", f"engine_ports: {ENGINE_PORTS}")
        )
        _firewall(config, True)
        cluster.start_server()

        # Before the agent: nothing guards the node.
        assert net.table() is None
        cluster.start_agent(
            "n1",
            cluster.token(),
            ["--engine", f"llama.cpp={binary}"],
            prefix=net.prefix(net.node),
        )
        cluster.wait_state("n1", "Ready", 30)
        body = {
            "replica_id": "r1",
            "engine": "llama.cpp",
            "port": ENGINE_PORT,
            "source": str(model),
            "model": "tiny",
            "cpu_cores": 1,
        }
        assert cluster.api("/api/v1/nodes/n1/shards", body=body) == {
            "replica_id": "r1",
            "node": "n1",
        }
        row = wait_replica(cluster, "r1", "ready", 120)
        assert row["port"] == ENGINE_PORT

        # The agent loaded llmgw's table, naming the control plane's address.
        table = wait_for(net.table, 30, "llmgw's table in the node")
        assert CP in table, table
        assert "42300-42399" in table, table
        state = cluster.state_dir("n1")
        status = net.status(state)
        assert (status["present"], status["in_sync"], status["problem"]) == (True, True, None)
        assert status["plan"]["control_planes"] == [CP]
        assert status["plan"]["engine_ports"] == ENGINE_PORTS

        # The engine answers the control plane, and nobody else.
        assert net.reach(net.cp, NODE_CP, ENGINE_PORT) == "answered"
        assert net.reach(net.out, NODE_OUT, ENGINE_PORT) == "refused"
        # Not an engine port: untouched.
        assert net.reach(net.out, NODE_OUT, OTHER_PORT) == "answered"
        # The agent's own stream is not cut: heartbeats still arrive over it.
        loaded = time.time()
        wait_for(
            lambda: (cluster.nodes()["n1"]["last_seen"] or 0) > loaded + 1,
            15,
            "heartbeats after the table was loaded",
        )
        assert cluster.nodes()["n1"]["state"] == "Ready"

        # Off: the control plane says so when it starts again, and the table goes.
        _firewall(config, False)
        cluster.start_server()
        wait_for(lambda: net.table() is None, 60, "llmgw's table to go from the node")
        wait_for(
            lambda: net.reach(net.out, NODE_OUT, ENGINE_PORT) == "answered",
            30,
            "the engine to answer from outside",
        )
        status = net.status(state)
        assert (status["present"], status["in_sync"], status["plan"]["enabled"]) == (
            False,
            True,
            False,
        ), status
    except BaseException:
        for name, proc in (("server", cluster.server), *cluster.agents.items()):
            if proc is not None:
                sys.stderr.write(f"--- {name} log ---\n{proc.text()[-6000:]}\n")
        raise
    finally:
        cluster.stop()
