"""llmgw's nftables table: plans refused by name, the script nft would load (checked by
nft itself, in check mode), the comparison with a loaded table, the saved plan."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.firewall import (
    STATE_FILE,
    FirewallError,
    FirewallPlan,
    difference,
    load_plan,
    render,
    save_plan,
)
from llmgw.cli import main

FULL = {
    "enabled": True,
    "networks": ["10.213.40.0/24", "fd00:213::/64"],
    "control_planes": ["10.213.40.2", "10.213.40.3", "fd00:213::2"],
    "engine_ports": "41000-41999",
    "agent_port": 8443,
    "peers": {"41001": ["10.213.40.7", "fd00:213::7"], "41002": ["10.213.41.0/28"]},
    "peer_ranges": {"41100-41999": ["10.213.40.7", "10.213.40.8"]},
}


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"networks": ["10.213.40.0/33"]}, "networks", "10.213.40.0/33"),
        ({"networks": ["10.213.40.1/24"]}, "networks", "10.213.40.1/24"),  # host bits
        ({"networks": "10.0.0.0/8"}, "networks", "10.0.0.0/8"),  # not a list
        ({"control_planes": ["cp1.example"]}, "control_planes", "cp1.example"),
        ({"control_planes": [10]}, "control_planes", "10"),
        ({"engine_ports": "41999-41000"}, "engine_ports", "41999-41000"),
        ({"engine_ports": "41000-70000"}, "engine_ports", "41000-70000"),
        ({"engine_ports": "many"}, "engine_ports", "many"),
        ({"agent_port": 0}, "agent_port", "0"),
        ({"agent_port": "https"}, "agent_port", "https"),
        ({"agent_port": 41500}, "agent_port", "41500"),  # inside the engines' range
        ({"peers": {"41001": ["10.0.0.300"]}}, "peers[41001]", "10.0.0.300"),
        ({"peers": {"8080": ["10.0.0.3"]}}, "peers", "8080"),  # outside the range
        ({"peers": {"x": ["10.0.0.3"]}}, "peers", "x"),
        ({"peer_ranges": {"41100-41999": ["10.0.0.300"]}}, "peer_ranges[41100-41999]", "300"),
        ({"peer_ranges": {"40000-41999": ["10.0.0.3"]}}, "peer_ranges", "40000-41999"),
        ({"peer_ranges": ["10.0.0.3"]}, "peer_ranges", "10.0.0.3"),
        ({"enabled": "yes"}, "enabled", "yes"),
    ],
)
def test_a_bad_plan_is_refused_naming_field_and_value(
    change: dict[str, Any], field: str, value: str
) -> None:
    with pytest.raises(FirewallError) as caught:
        FirewallPlan.from_map({**FULL, **change})
    said = str(caught.value)
    assert said.startswith(f"{field}: ") and value in said, said


def test_a_plan_made_directly_is_checked_too() -> None:
    with pytest.raises(FirewallError, match="control_planes: 'nope'"):
        FirewallPlan(control_planes=("nope",))


def test_round_trip_through_its_map_and_the_state_dir(tmp_path: Path) -> None:
    plan = FirewallPlan.from_map(FULL)
    assert plan.peers == {41001: ("10.213.40.7", "fd00:213::7"), 41002: ("10.213.41.0/28",)}
    assert plan.peer_ranges == {(41100, 41999): ("10.213.40.7", "10.213.40.8")}
    assert FirewallPlan.from_map(plan.to_map()) == plan
    assert FirewallPlan.from_map(json.loads(json.dumps(plan.to_map()))) == plan
    assert FirewallPlan.from_map({}) == FirewallPlan()
    assert FirewallPlan.from_map({**FULL, "newer_field": 1}) == plan  # a newer plan

    assert load_plan(tmp_path) is None
    save_plan(tmp_path, plan)
    assert load_plan(tmp_path) == plan
    save_plan(tmp_path, FirewallPlan(enabled=False))
    assert load_plan(tmp_path) == FirewallPlan(enabled=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]

    (tmp_path / STATE_FILE).write_text('{"engine_ports": "1-"}')
    with pytest.raises(FirewallError, match=f"{STATE_FILE}: engine_ports"):
        load_plan(tmp_path)
    (tmp_path / STATE_FILE).write_text("{")
    with pytest.raises(FirewallError, match="cannot be read"):
        load_plan(tmp_path)


def test_the_script_replaces_the_table_in_one_load() -> None:
    script = render(FirewallPlan.from_map(FULL))
    lines = script.splitlines()
    assert lines[:3] == ["table inet llmgw {}", "delete table inet llmgw", "table inet llmgw {"]
    assert "type filter hook input priority filter - 5; policy accept;" in script
    rules = [line.strip() for line in lines if "dport" in line]
    assert rules == [
        "tcp dport 41001 ip saddr { 10.213.40.7 } accept",
        "tcp dport 41001 ip6 saddr { fd00:213::7 } accept",
        "tcp dport 41002 ip saddr { 10.213.41.0/28 } accept",
        # Where NCCL's ports may fall: the replica's members only, before the reset.
        "tcp dport 41100-41999 ip saddr { 10.213.40.7, 10.213.40.8 } accept",
        "tcp dport 41000-41999 ip saddr @cp4 accept",
        "tcp dport 41000-41999 ip6 saddr @cp6 accept",
        "tcp dport 41000-41999 reject with tcp reset",
        "tcp dport 8443 ip saddr @nets4 accept",
        "tcp dport 8443 ip6 saddr @nets6 accept",
        "tcp dport 8443 reject with tcp reset",
    ]
    assert "elements = { 10.213.40.2/31 };" in script  # .2 and .3, merged
    # The agent port is guarded only on a control plane's machine, with networks named.
    changes: list[dict[str, Any]] = [{"agent_port": None}, {"networks": []}]
    for change in changes:
        assert "8443" not in render(FirewallPlan.from_map({**FULL, **change}))


def test_overlapping_addresses_are_merged_as_nft_needs() -> None:
    plan = FirewallPlan(control_planes=("10.0.0.1", "10.0.0.0/30", "10.0.0.2", "10.0.0.3"))
    assert "elements = { 10.0.0.0/30 };" in render(plan)


def _nft_check(script: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("nft") is None:
        pytest.skip("nft is not installed (Debian: nftables)")
    if os.geteuid() != 0:
        pytest.skip("nft's check mode needs root")
    return subprocess.run(["nft", "-c", "-f", "-"], input=script, capture_output=True, text=True)


@pytest.mark.parametrize(
    "plan",
    [
        FirewallPlan(),  # every set empty, no peers, no agent port
        FirewallPlan.from_map(FULL),
        FirewallPlan(control_planes=("fd00::1",), engine_ports="41000-41000"),
        FirewallPlan(networks=("0.0.0.0/0", "::/0"), agent_port=8443, peers={41000: ("::1",)}),
        FirewallPlan(metrics_port=9464, metrics_scrapers=("10.0.0.4", "fd00::/64")),
    ],
    ids=["empty", "full", "ipv6-one-port", "everywhere", "metrics-scrapers"],
)
def test_nft_accepts_the_script(plan: FirewallPlan) -> None:
    checked = _nft_check(render(plan))
    assert checked.returncode == 0, checked.stderr + render(plan)
    assert "{ }" not in render(plan)


def test_nft_check_mode_would_catch_a_bad_script() -> None:
    checked = _nft_check(render(FirewallPlan()).replace("@cp4", "{ }"))
    assert checked.returncode != 0


def _listing(cp4: list[Any], rules: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """``nft -j list table inet llmgw`` as nft 1.0 answers, trimmed to what is compared."""

    def named(name: str, kind: str, elem: list[Any]) -> dict[str, Any]:
        body = {"family": "inet", "name": name, "table": "llmgw", "type": kind, "handle": 9}
        return {"set": {**body, "flags": ["interval"], **({"elem": elem} if elem else {})}}

    chain = {"name": "input", "type": "filter", "hook": "input", "prio": -5, "policy": "accept"}
    return {
        "nftables": [
            {"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"table": {"family": "inet", "name": "llmgw", "handle": 2}},
            named("cp4", "ipv4_addr", cp4),
            named("cp6", "ipv6_addr", []),
            named("nets4", "ipv4_addr", []),
            named("nets6", "ipv6_addr", []),
            {"chain": {"family": "inet", "table": "llmgw", "handle": 1, **chain}},
            *(
                {"rule": {"chain": "input", "handle": 3 + i, "expr": e}}
                for i, e in enumerate(rules)
            ),
        ]
    }


def _match(left: dict[str, Any], right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


DPORT = {"payload": {"protocol": "tcp", "field": "dport"}}
SADDR = {"payload": {"protocol": "ip", "field": "saddr"}}
ENGINES = {"range": [41000, 41999]}
RULES: list[list[dict[str, Any]]] = [
    [_match({"meta": {"key": "iif"}}, "lo"), {"accept": None}],
    [_match({"ct": {"key": "state"}}, ["related", "established"], "in"), {"accept": None}],
    [_match(DPORT, 41001), _match(SADDR, {"set": ["10.0.0.8", "10.0.0.9"]}), {"accept": None}],
    [_match(DPORT, ENGINES), _match(SADDR, "@cp4"), {"accept": None}],
    [
        _match(DPORT, ENGINES),
        _match({"payload": {"protocol": "ip6", "field": "saddr"}}, "@cp6"),
        {"accept": None},
    ],
    [_match(DPORT, ENGINES), {"reject": {"type": "tcp reset"}}],
]
PLAN = FirewallPlan(
    control_planes=("10.0.0.1", "10.0.0.2", "10.1.0.0/16"), peers={41001: ("10.0.0.9", "10.0.0.8")}
)


def test_a_loaded_table_is_compared_by_meaning_not_by_text() -> None:
    # However nft lists the elements (addresses, a range, a prefix), the same addresses.
    for cp4 in (
        ["10.0.0.1", "10.0.0.2", {"prefix": {"addr": "10.1.0.0", "len": 16}}],
        [{"range": ["10.0.0.1", "10.0.0.2"]}, {"range": ["10.1.0.0", "10.1.255.255"]}],
    ):
        assert difference(PLAN, _listing(cp4, RULES)) is None

    cp4 = ["10.0.0.1", "10.0.0.2", {"prefix": {"addr": "10.1.0.0", "len": 16}}]
    wider = [*cp4, "10.9.9.9"]
    assert "set cp4 is { 10.0.0.1, 10.0.0.2, 10.1.0.0/16, 10.9.9.9 }" in str(
        difference(PLAN, _listing(wider, RULES))
    )
    added = [*RULES[:3], [_match(DPORT, 9), {"accept": None}], *RULES[3:]]
    assert "not in the plan: tcp dport 9 accept" in str(difference(PLAN, _listing(cp4, added)))
    missing = RULES[:-1]
    assert "missing: tcp dport 41000-41999 reject with tcp reset" in str(
        difference(PLAN, _listing(cp4, missing))
    )
    counted = [*RULES[:-1], [*RULES[-1][:1], {"counter": None}, *RULES[-1][1:]]]
    assert "counter" in str(difference(PLAN, _listing(cp4, counted)))
    swapped = [*RULES[:3], RULES[5], RULES[3], RULES[4]]
    assert "in another order" in str(difference(PLAN, _listing(cp4, swapped)))


def test_sync_without_a_saved_plan_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if shutil.which("nft") is None or os.geteuid() != 0:
        pytest.skip("sync needs nft and root before it looks for a plan")
    assert main(["firewall", "sync", "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"no plan saved in {tmp_path / STATE_FILE}" in err and "nothing was changed" in err


def test_the_agents_metrics_port_is_let_in_from_the_named_scrapers_only() -> None:
    plan = FirewallPlan.from_map(
        {**FULL, "metrics_port": 9464, "metrics_scrapers": ["10.213.50.4", "fd00:50::/64"]}
    )
    assert FirewallPlan.from_map(plan.to_map()) == plan
    rules = [line.strip() for line in render(plan).splitlines() if "9464" in line]
    assert rules == [
        "tcp dport 9464 ip saddr { 10.213.50.4 } accept",
        "tcp dport 9464 ip6 saddr { fd00:50::/64 } accept",
        "tcp dport 9464 reject with tcp reset",
    ]
    # No scrapers named: the port is left to the machine's own rules (the token guards it).
    assert "9464" not in render(FirewallPlan.from_map({**FULL, "metrics_port": 9464}))
    with pytest.raises(FirewallError, match="metrics_port: 41500 lies in engine_ports"):
        FirewallPlan.from_map({**FULL, "metrics_port": 41500})
    with pytest.raises(FirewallError, match="metrics_scrapers.*scraper.example"):
        FirewallPlan.from_map(
            {**FULL, "metrics_port": 9464, "metrics_scrapers": ["scraper.example"]}
        )
