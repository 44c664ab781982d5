"""llmgw's nftables table loaded by real nft, with real connections, in namespaces.

Three network namespaces stand for a node, a control plane and a machine outside: the
node is joined to the control plane by one veth pair (10.213.40.0/24) and to the
outside by another (10.213.41.0/24). HTTP servers on the node stand for engines (41001,
41002, in the engine range) and for something of the machine's own (8099). A refused
connection is seen as such (a TCP reset comes back at once), so no test waits to show
that something did not happen.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.agent import nodewall
from llmgw.agent.firewall import FirewallPlan, Nft, save_plan
from llmgw.agent.nodewall import NodeFirewall
from llmgw.wire.messages import Firewall
from tests.e2e.cluster import wait_for
from tests.support.netns import ip, reach, run_in
from tests.support.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
NODE_CP, CP = "10.213.40.1", "10.213.40.2"
NODE_OUT, OUT = "10.213.41.1", "10.213.41.2"
LISTENERS = (41001, 41002, 8099)


@dataclass
class Net:
    node: str
    cp: str
    out: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def nft(self) -> Nft:
        return Nft(("ip", "netns", "exec", self.node, "nft"))

    def reach(self, netns: str, host: str, port: int) -> str:
        """answered / refused / timeout: an HTTP GET from ``netns``, as it went."""
        return reach(netns, host, port, "/")

    def in_node(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run_in(self.node, *argv)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces and nftables need root")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("needs iproute2 (`ip netns`) and nftables (`nft`)")
    pid = os.getpid()
    net = Net(f"llmgw-fw-node-{pid}", f"llmgw-fw-cp-{pid}", f"llmgw-fw-out-{pid}")
    links = (f"fwa{pid}n", f"fwb{pid}n")
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
        pairs = ((links[0], net.cp, NODE_CP, CP), (links[1], net.out, NODE_OUT, OUT))
        for link, other, node_address, other_address in pairs:
            peer = link[:-1] + "p"
            ip("link", "add", link, "type", "veth", "peer", "name", peer)
            for name, netns, address in (
                (link, net.node, node_address),
                (peer, other, other_address),
            ):
                ip("link", "set", name, "netns", netns)
                ip("-n", netns, "addr", "add", f"{address}/24", "dev", name)
                ip("-n", netns, "link", "set", name, "up")
        for port in LISTENERS:
            serve = [sys.executable, "-m", "http.server", str(port), "--bind", "0.0.0.0"]
            net.procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", net.node, *serve],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=REPO / "tests",
                )
            )

            def listening(port: int = port) -> bool:
                return net.reach(net.node, "127.0.0.1", port) == "answered"

            wait_for(listening, 20, f"the listener on {port} in the node's namespace")
        yield net
    finally:
        for proc in net.procs:
            stop_process(proc)
        for netns in made:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        for link in links:  # left behind only when it was never moved into a namespace
            subprocess.run(["ip", "link", "del", link], capture_output=True)


@pytest.fixture
def node(net: Net) -> Iterator[Net]:
    """The net, with no llmgw table before each test and after it."""
    net.nft.remove()
    yield net
    net.nft.remove()


PLAN = FirewallPlan(control_planes=(CP,), engine_ports="41000-41999")


def test_engine_ports_answer_only_the_control_plane(node: Net) -> None:
    assert node.reach(node.out, NODE_OUT, 41001) == "answered"  # no table yet

    node.nft.apply(PLAN)

    assert node.reach(node.cp, NODE_CP, 41001) == "answered"
    assert node.reach(node.out, NODE_OUT, 41001) == "refused"
    assert node.reach(node.out, NODE_OUT, 41002) == "refused"
    # Not an engine port: the machine's own business, untouched.
    assert node.reach(node.out, NODE_OUT, 8099) == "answered"
    status = node.nft.status(PLAN)
    assert (status["present"], status["in_sync"], status["problem"]) == (True, True, None)
    assert "    tcp dport 41000-41999 reject with tcp reset" in status["rules"]


def test_a_replicas_peers_reach_its_port(node: Net) -> None:
    node.nft.apply(FirewallPlan(control_planes=(CP,), peers={41002: (OUT,)}))

    assert node.reach(node.out, NODE_OUT, 41002) == "answered"
    assert node.reach(node.out, NODE_OUT, 41001) == "refused"
    assert node.reach(node.cp, NODE_CP, 41001) == "answered"


def test_the_agent_port_answers_only_the_networks(node: Net) -> None:
    plan = FirewallPlan(control_planes=(CP,), agent_port=8099, networks=("10.213.40.0/24",))
    node.nft.apply(plan)

    assert node.reach(node.out, NODE_OUT, 8099) == "refused"
    assert node.reach(node.cp, NODE_CP, 8099) == "answered"
    assert node.reach(node.out, NODE_OUT, 41001) == "refused"
    assert node.nft.status(plan)["in_sync"] is True


def test_status_sees_edits_and_removal(node: Net) -> None:
    assert node.nft.status(PLAN)["present"] is False
    plan = FirewallPlan(
        control_planes=(CP, "10.213.40.3", "10.213.40.0/30", "fd00:213::2", "fd00:213::/120"),
        peers={41002: (OUT, "10.213.41.3", "fd00:213::7")},
        networks=("10.213.40.0/24", "fd00::/8"),
        agent_port=8099,
    )
    node.nft.apply(plan)
    assert node.nft.status(plan)["in_sync"] is True  # merged elements, prefixes: the same

    edited = node.in_node("nft", "add", "rule", "inet", "llmgw", "input", "tcp dport 9 accept")
    assert edited.returncode == 0, edited.stderr
    status = node.nft.status(plan)
    assert (status["present"], status["in_sync"]) == (True, False)
    assert "not in the plan: tcp dport 9 accept" in status["problem"]
    assert node.nft.status(PLAN)["in_sync"] is False  # another plan
    assert node.nft.status(None)["in_sync"] is None  # no plan to compare with

    node.nft.apply(plan)  # loaded again over the edited table
    assert node.nft.status(plan)["in_sync"] is True

    assert node.nft.remove() is True
    assert node.reach(node.out, NODE_OUT, 41001) == "answered"
    status = node.nft.status(plan)
    assert (status["present"], status["in_sync"], status["rules"]) == (False, False, [])
    assert node.nft.remove() is False

    node.nft.apply(plan)
    off = FirewallPlan(enabled=False)
    node.nft.apply(off)  # off: the table goes
    assert node.reach(node.out, NODE_OUT, 41001) == "answered"
    assert node.nft.status(off)["in_sync"] is True


def test_the_command_line_syncs_the_saved_plan(node: Net, tmp_path: Path) -> None:
    llmgw = [sys.executable, "-m", "llmgw", "firewall"]
    where = ["--state-dir", str(tmp_path)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return node.in_node(*llmgw, *args, *where)

    assert run("sync").returncode == 1  # no plan saved: nothing done
    save_plan(tmp_path, PLAN)
    shown = run("status")
    assert shown.returncode == 1 and "the table is absent" in shown.stdout, shown.stdout

    synced = run("sync")
    assert synced.returncode == 0, synced.stderr
    assert node.reach(node.out, NODE_OUT, 41001) == "refused"
    shown = run("status", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    status = json.loads(shown.stdout)
    assert (status["present"], status["in_sync"], status["nft"]) == (True, True, True)
    assert status["plan"] == PLAN.to_map()
    assert "it matches" in run("status").stdout

    save_plan(tmp_path, FirewallPlan(enabled=False))
    synced = run("sync")
    assert synced.returncode == 0 and "removed" in synced.stdout, synced.stdout
    assert node.reach(node.out, NODE_OUT, 41001) == "answered"


async def test_a_replicas_members_reach_the_ports_nccl_gets_from_the_kernel(
    node: Net, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL and gloo listen on ports the kernel picks. The node's namespace hands them
    out inside the engine range, as Linux's default 32768-60999 does for 41000-41999; a
    listener bound to port 0 stands for one. The replica's member (here the machine
    "outside") reaches it through the agent's table; anyone else does not."""
    sysctl = node.in_node("sysctl", "-w", "net.ipv4.ip_local_port_range=41500 41509")
    assert sysctl.returncode == 0, sysctl.stderr
    serve = [sys.executable, "-u", "-m", "http.server", "0", "--bind", "0.0.0.0"]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", node.node, *serve],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO / "tests",
        text=True,
    )
    try:
        assert listener.stdout is not None
        said = listener.stdout.readline()  # "Serving HTTP on 0.0.0.0 port 41503 ..."
        port = int(said.split(" port ")[1].split()[0])
        assert 41500 <= port <= 41509, said
        # The agent reads the node's sysctls where it runs; here, copied out of its
        # namespace.
        proc = tmp_path / "proc"
        proc.mkdir()
        for name in ("ip_local_port_range", "ip_local_reserved_ports"):
            (proc / name).write_text(node.in_node("cat", f"/proc/sys/net/ipv4/{name}").stdout)
        monkeypatch.setattr(nodewall, "available", lambda: True)
        monkeypatch.setattr(nodewall, "own_addresses", lambda: {NODE_CP})
        wall = NodeFirewall(tmp_path / "state", node.nft, proc=proc)
        (tmp_path / "state").mkdir()
        await wall.keep(Firewall(control_planes=[CP], engine_ports="41000-41999"))

        # Before: the replica's own port alone is opened to its member (as it was).
        await wall.peers({41002: (OUT,)})
        assert wall.problem is None
        assert node.reach(node.out, NODE_OUT, 41002) == "answered"
        assert node.reach(node.out, NODE_OUT, port) == "refused"

        # Its ranks meet over NCCL: the member is let in where the kernel picks ports.
        await wall.peers({41002: (OUT,)}, (OUT,))
        assert wall.problem is None and wall.plan is not None
        assert wall.plan.peer_ranges == {(41500, 41509): (OUT,)}
        assert node.reach(node.out, NODE_OUT, port) == "answered"
        assert node.reach(node.out, NODE_OUT, 41001) == "refused"  # not another engine
        assert node.nft.status(wall.plan)["in_sync"] is True
    finally:
        stop_process(listener)
        if listener.stdout is not None:
            listener.stdout.close()
        node.in_node("sysctl", "-w", "net.ipv4.ip_local_port_range=32768 60999")


async def test_the_agent_takes_a_changed_firewall_at_once(node: Net, tmp_path: Path) -> None:
    """What the control plane pushes when the firewall is changed (``ctl firewall``):
    the running agent's table follows each message, no restart. Sent with no control
    plane address, the node counts as a control plane's machine: its agents' port (here
    8099) is kept to the networks."""
    wall = NodeFirewall(tmp_path, node.nft)

    def told(enabled: bool, networks: list[str]) -> Firewall:
        return Firewall(enabled=enabled, networks=networks, agent_port=8099)

    await wall.keep(told(True, ["10.213.40.0/24"]))
    assert wall.problem is None
    assert node.reach(node.cp, NODE_CP, 8099) == "answered"
    assert node.reach(node.out, NODE_OUT, 8099) == "refused"

    await wall.keep(told(True, ["10.213.41.0/24"]))
    assert node.reach(node.out, NODE_OUT, 8099) == "answered"
    assert node.reach(node.cp, NODE_CP, 8099) == "refused"
    assert node.nft.status(wall.plan)["in_sync"] is True

    await wall.keep(told(False, ["10.213.41.0/24"]))
    assert node.nft.status(wall.plan)["present"] is False
    assert node.reach(node.cp, NODE_CP, 8099) == "answered"
    assert node.reach(node.out, NODE_OUT, 41001) == "answered"
