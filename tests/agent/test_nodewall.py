"""The cluster's Firewall message as this node's plan: control planes resolved (loopback
ones dropped), the agent port's rule kept only on a control plane's own machine, and the
plan kept in the state dir whether or not this agent may load it."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import nodewall
from llmgw.agent.firewall import (
    ROOT_NOTE,
    STATE_FILE,
    FirewallError,
    FirewallPlan,
    load_plan,
    render,
)
from llmgw.agent.nodewall import NodeFirewall, addresses_of, plan_of
from llmgw.wire.messages import Firewall

NETS = ["10.0.0.0/24"]
OWN_ADDRESSES = nodewall.own_addresses


@pytest.fixture(autouse=True)
def elsewhere(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """This machine's addresses, as the test says; none of the control planes' unless
    a test adds one."""
    mine = {"192.0.2.50"}
    monkeypatch.setattr(nodewall, "own_addresses", lambda: mine)
    return mine


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host names resolved from a table rather than the network; others do not resolve."""
    table: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host == "localhost":
            return real(host, port, *args, **kw)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
            for a in table[host]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


def test_addresses_stand_for_themselves_and_names_are_resolved(
    names: dict[str, list[str]],
) -> None:
    names["cp1.example"] = ["10.0.0.2", "fd00::2", "10.0.0.2"]
    found = addresses_of(["10.0.0.1", "::ffff:10.0.0.5", "fe80::1%eth0", "cp1.example", "nope"])
    assert found == ("10.0.0.1", "10.0.0.5", "fe80::1", "10.0.0.2", "fd00::2")
    # The same address twice, by name and as itself, is one.
    assert addresses_of(["10.0.0.2", "cp1.example"]) == ("10.0.0.2", "fd00::2")


def test_loopback_control_planes_are_dropped(names: dict[str, list[str]]) -> None:
    names["cp.example"] = ["127.0.1.1"]  # Debian's own host name line
    msg = Firewall(
        networks=NETS,
        control_planes=["localhost", "127.0.0.1", "::1", "::ffff:127.0.0.1", "cp.example"],
    )
    assert plan_of(msg).control_planes == ()
    msg = Firewall(networks=NETS, control_planes=["localhost", "10.0.0.2", "::ffff:10.0.0.5"])
    assert plan_of(msg).control_planes == ("10.0.0.2", "10.0.0.5")


def test_the_plan_carries_the_message(names: dict[str, list[str]]) -> None:
    msg = Firewall(
        enabled=False,
        networks=["10.0.0.0/24", "fd00::/64"],
        control_planes=["10.0.0.2"],
        engine_ports="42000-42099",
        agent_port=8443,
    )
    assert plan_of(msg) == FirewallPlan(
        enabled=False,
        networks=("10.0.0.0/24", "fd00::/64"),
        control_planes=("10.0.0.2",),
        engine_ports="42000-42099",
        agent_port=None,  # not a control plane's machine
    )


def test_a_plan_that_does_not_hold_is_refused(names: dict[str, list[str]]) -> None:
    with pytest.raises(FirewallError, match="networks"):
        plan_of(Firewall(networks=["10.0.0.0/33"], control_planes=["10.0.0.2"]))


@pytest.mark.parametrize(
    ("planes", "mine", "networks", "kept"),
    [
        (["10.0.0.2"], {"10.0.0.2"}, NETS, True),  # this is the control plane's machine
        (["10.0.0.2", "10.0.0.3"], {"10.0.0.3", "192.0.2.50"}, NETS, True),
        (["::ffff:10.0.0.2"], {"10.0.0.2"}, NETS, True),
        (["10.0.0.2"], {"10.0.0.9"}, NETS, False),  # another machine's
        (["10.0.0.2"], {"10.0.0.2"}, [], False),  # no networks: nothing to keep it to
        # One machine: its control plane is on loopback, here.
        (["localhost"], {"192.0.2.50"}, NETS, True),
        (["localhost"], {"192.0.2.50"}, [], False),
    ],
)
def test_the_agent_port_is_kept_only_on_a_control_planes_own_machine(
    monkeypatch: pytest.MonkeyPatch,
    names: dict[str, list[str]],
    planes: list[str],
    mine: set[str],
    networks: list[str],
    kept: bool,
) -> None:
    monkeypatch.setattr(nodewall, "own_addresses", lambda: mine)
    msg = Firewall(networks=networks, control_planes=planes, agent_port=8443)
    assert plan_of(msg).agent_port == (8443 if kept else None)


def test_own_addresses_are_plain_addresses() -> None:
    mine = OWN_ADDRESSES()  # the real one; the autouse fixture stands in for it elsewhere
    assert mine and all(ipaddress.ip_address(a) for a in mine)  # zones (%eth0) cut off


class RefusingNft:
    """An nft that must never be run: these tests are not the machine's firewall."""

    def apply(self, plan: FirewallPlan) -> None:
        raise AssertionError("nft was run")


async def test_keep_saves_the_plan_and_says_it_keeps_no_table_unless_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodewall, "available", lambda: False)
    wall = NodeFirewall(tmp_path, RefusingNft())  # type: ignore[arg-type]
    msg = Firewall(networks=NETS, control_planes=["10.0.0.2"], agent_port=8443)
    await wall.keep(msg)
    assert wall.plan == plan_of(msg)
    assert load_plan(tmp_path) == wall.plan
    assert (tmp_path / STATE_FILE).is_file()
    assert wall.problem == f"no table kept: {ROOT_NOTE}"
    assert "root" in wall.problem

    await wall.keep(Firewall(enabled=False, networks=NETS, control_planes=["10.0.0.2"]))
    assert wall.problem is None
    kept = load_plan(tmp_path)
    assert kept is not None and kept.enabled is False


async def test_keep_with_nft_loads_the_plan_once_and_says_its_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodewall, "available", lambda: True)
    applied: list[FirewallPlan] = []
    refuse: list[str] = []

    class Nft:
        def apply(self, plan: FirewallPlan) -> None:
            if refuse:
                raise FirewallError(refuse[0])
            applied.append(plan)

    wall = NodeFirewall(tmp_path, Nft())  # type: ignore[arg-type]
    msg = Firewall(networks=NETS, control_planes=["10.0.0.2"])
    await wall.keep(msg)
    await wall.keep(msg)  # the same plan again: nothing to load
    assert applied == [plan_of(msg)] and wall.problem is None

    refuse.append("nft: Could not process rule: No such file or directory")
    await wall.keep(Firewall(networks=["10.0.1.0/24"], control_planes=["10.0.0.2"]))
    assert wall.problem == "nft: Could not process rule: No such file or directory"
    kept = load_plan(tmp_path)
    assert kept is not None and kept.networks == ("10.0.1.0/24",)


async def test_keep_refuses_an_unusable_message_and_keeps_the_last_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodewall, "available", lambda: False)
    wall = NodeFirewall(tmp_path, RefusingNft())  # type: ignore[arg-type]
    good = Firewall(networks=NETS, control_planes=["10.0.0.2"])
    await wall.keep(good)
    await wall.keep(Firewall(networks=["not a network"], control_planes=["10.0.0.2"]))
    assert wall.problem is not None
    assert wall.problem.startswith("the cluster's firewall settings cannot be used:")
    assert wall.plan == plan_of(good) and load_plan(tmp_path) == plan_of(good)


async def test_a_replicas_peers_are_let_in_to_its_ports_and_taken_out_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodewall, "available", lambda: True)
    applied: list[FirewallPlan] = []

    class Nft:
        def apply(self, plan: FirewallPlan) -> None:
            applied.append(plan)

    wall = NodeFirewall(tmp_path, Nft())  # type: ignore[arg-type]
    # Peers known before the cluster's message wait for it: no plan without it.
    await wall.peers({41005: ("10.0.0.7", "10.0.0.8")})
    assert applied == []
    await wall.keep(Firewall(control_planes=["10.0.0.2"], engine_ports="41000-41999"))
    assert applied[-1].peers == {41005: ("10.0.0.7", "10.0.0.8")}
    assert applied[-1].control_planes == ("10.0.0.2",)
    # A port outside the engine range is not the table's to open.
    await wall.peers({41005: ("10.0.0.7",), 50000: ("10.0.0.9",)})
    assert applied[-1].peers == {41005: ("10.0.0.7",)}
    loaded = len(applied)
    await wall.peers({41005: ("10.0.0.7",), 50000: ("10.0.0.9",)})
    assert len(applied) == loaded  # nothing changed, nothing loaded
    await wall.peers({})
    assert applied[-1].peers == {} and wall.problem is None
    await wall.peers({41006: ("not an address",)})
    assert wall.problem is not None and "peers" in wall.problem
    assert applied[-1].peers == {}


async def test_members_of_an_nccl_replica_are_let_in_where_the_kernel_picks_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL and gloo listen on ports the kernel picks; where those fall in the engine
    range, the replica's member nodes (and only they) are let in."""
    monkeypatch.setattr(nodewall, "available", lambda: True)
    applied: list[FirewallPlan] = []

    class Nft:
        def apply(self, plan: FirewallPlan) -> None:
            applied.append(plan)

    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "ip_local_port_range").write_text("32768\t60999\n")
    (proc / "ip_local_reserved_ports").write_text("41000-41099\n")
    wall = NodeFirewall(tmp_path, Nft(), proc=proc)  # type: ignore[arg-type]
    await wall.keep(Firewall(control_planes=["10.0.0.2"], engine_ports="41000-41999"))
    members = ("10.0.0.7", "10.0.0.8")
    await wall.peers({41005: members}, members)
    plan = applied[-1]
    assert plan.peers == {41005: members}
    assert plan.peer_ranges == {(41100, 41999): members}
    rules = render(plan).splitlines()
    rule = "    tcp dport 41100-41999 ip saddr { 10.0.0.7, 10.0.0.8 } accept"
    assert rule in rules
    assert rules.index(rule) < rules.index("    tcp dport 41000-41999 reject with tcp reset")
    assert load_plan(tmp_path) == plan  # kept for `llmgw firewall sync`

    # The replica gone: its members are let in nowhere.
    await wall.peers({}, ())
    assert (applied[-1].peers, applied[-1].peer_ranges) == ({}, {})

    # The admin reserved the whole engine range: the kernel never picks one of its ports,
    # so only the replica's own ports are opened.
    (proc / "ip_local_reserved_ports").write_text("41000-41999\n")
    await wall.peers({41005: members}, members)
    assert (applied[-1].peers, applied[-1].peer_ranges) == ({41005: members}, {})
