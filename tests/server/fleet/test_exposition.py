"""The fleet on /metrics: names, units, labels, absent figures and stale nodes."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

from llmgw import metricstext
from llmgw.server.fleet import exposition
from llmgw.server.fleet.exposition import (
    NodeSnapshot,
    NodeTexts,
    cluster_metrics,
    fleet_metrics,
    up_metrics,
    warning_kind,
)
from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.messages import ShardStatus, ShardUsage
from llmgw.wire.states import NodeState, ShardState
from llmgw.wire.warnings import THROTTLE_REASONS
from tests.support.nodefacts import facts
from tests.support.nodefacts import live as figures

NOW = 1_800_000_000.0
GPU = {
    "index": 0,
    "uuid": "GPU-a",
    "name": "NVIDIA H100 80GB HBM3",
    "driver": "580.105.08",
    "utilization": 87,
    "memory_total": 85 * 2**30,
    "memory_used": 2**30,
    "temperature": 61,
    "power": 512.5,
    "power_limit": 700.0,
    "energy": 123456.789,
    "sm_clock": 1980,
    "pstate": "P0",
    "throttle": ["sw_power_cap"],
    "pcie_gen": 5,
    "pcie_width": 8,
    "pcie_gen_max": 5,
    "pcie_width_max": 16,
    "processes": [{"pid": 7, "name": "python", "memory": 2**20}],
}
HEALTH = {
    "uuid": "GPU-a",
    "index": 0,
    "ecc_volatile_uncorrected": 1,
    "ecc_aggregate_corrected": 12,
    "remap_pending": True,
    "xids": [{"code": 79, "count": 2, "last": NOW - 60}],
    "nvlink_links": 18,
    "nvlink_active": 17,
    "nvlink_errors": {"replay": 3},
}


def view(node_id: str, last_seen: float, **live: object) -> NodeView:
    v = NodeView(id=node_id, cert_serial=1, state=NodeState.READY, last_seen=last_seen)
    v.facts = facts(cpu_count=64, memory_total=512 * 2**30, gpus=[GPU], cuda_version="13.0")
    v.live = figures(
        last_seen,
        **{
            "cpu_percent": 25.0,
            "memory_available": 500 * 2**30,
            "load": [1.5, 1.0, 0.5],
            "gpu_health": [HEALTH],
            "vitals": {"cpu_temperatures": {"package0": 55.0}, "cpu_power": {"package0": 180.2}},
            "health_warnings": ["pcie: card 0 runs at x8 Gen5. Fix: reseat it"],
            **live,
        },
    )
    v.shards = {"r1": ShardStatus("r1", ShardState.READY, source="hf:org/model", cards=["GPU-a"])}
    v.usage = {"r1": ShardUsage("r1", cpu_percent=150.0, rss=3 * 2**30)}
    return v


def sample(text: str, name: str, *labels: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(label in line for label in labels):
            return line.rsplit(" ", 1)[1]
    return None


def test_families_units_and_labels() -> None:
    text = "\n".join(fleet_metrics([view("n1", NOW - 5)], warning_kind, now=NOW)) + "\n"
    card = 'node="n1",gpu="0",uuid="GPU-a",model="NVIDIA H100 80GB HBM3"'
    assert sample(text, "llmgw_gpu_busy_ratio", card) == "0.87"
    assert sample(text, "llmgw_gpu_sm_clock_hertz", card) == "1980000000"
    assert sample(text, "llmgw_gpu_energy_joules_total", card) == "123456.789"
    assert sample(text, "llmgw_gpu_throttled", 'reason="sw_power_cap"') == "1"
    assert sample(text, "llmgw_gpu_throttled", 'reason="hw_slowdown"') == "0"
    assert sample(text, "llmgw_gpu_ecc_errors_total", 'scope="volatile",kind="uncorrected"') == "1"
    # Counts the card did not give are absent, not 0.
    assert sample(text, "llmgw_gpu_ecc_errors_total", 'scope="volatile",kind="corrected"') is None
    assert sample(text, "llmgw_gpu_fan_ratio") is None
    assert sample(text, "llmgw_gpu_memory_temperature_celsius") is None
    assert sample(text, "llmgw_gpu_xid_errors_total", 'xid="79"') == "2"
    assert sample(text, "llmgw_gpu_nvlink_errors_total", 'counter="replay"') == "3"
    assert sample(text, "llmgw_gpu_remap_pending") == "1"
    assert sample(text, "llmgw_gpu_foreign_memory_bytes") == str(2**20)
    assert sample(text, "llmgw_gpu_info", 'cuda="13.0"', 'driver="580.105.08"') == "1"
    assert sample(text, "llmgw_node_memory_used_bytes", 'node="n1"') == str(12 * 2**30)
    assert sample(text, "llmgw_node_cpu_utilization_ratio") == "0.25"
    assert sample(text, "llmgw_node_cpu_power_watts", 'package="package0"') == "180.2"
    assert sample(text, "llmgw_node_warnings", 'kind="pcie"') == "1"
    assert sample(text, "llmgw_shard_cpu_cores", 'replica="r1"', 'model="hf:org/model"') == "1.5"
    assert text.count("# TYPE llmgw_gpu_busy_ratio gauge") == 1

    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs Debian's prometheus package"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_a_silent_node_has_only_its_up_sample() -> None:
    quiet = view("n2", NOW - 61)
    quiet.state = NodeState.NOT_READY
    text = "\n".join(fleet_metrics([view("n1", NOW), quiet], warning_kind, now=NOW))
    assert sample(text, "llmgw_node_up", 'node="n2"') == "0"
    assert sample(text, "llmgw_node_up", 'node="n1"') == "1"
    assert not [line for line in text.splitlines() if 'node="n2"' in line and "_up{" not in line]


def test_cluster_families() -> None:
    text = "\n".join(
        cluster_metrics(
            [("m", 3, 2)],
            [("k1", "alice", 90, 100), ("k2", "bob", 5, 0)],
            {("m", "r1"): 2.5},
        )
    )
    assert sample(text, "llmgw_model_replicas_wanted", 'model="m"') == "3"
    assert sample(text, "llmgw_model_replicas_ready", 'model="m"') == "2"
    assert sample(text, "llmgw_key_budget_used_ratio", 'key="k1"') == "0.9"
    assert sample(text, "llmgw_key_budget_used_ratio", 'key="k2"') is None
    assert sample(text, "llmgw_replica_joules_per_token", 'replica="r1"') == "2.5"


def test_warning_kind() -> None:
    assert warning_kind("pcie: card 1 runs at x8") == "pcie"
    assert warning_kind("NVML: could not start") == "nvml"
    assert warning_kind("no colon here") == "other"
    assert warning_kind("two words: here") == "other"


def test_a_nodes_text_is_written_again_only_when_its_figures_change() -> None:
    nodes = [view("n1", NOW), view("n2", NOW)]
    texts = NodeTexts()
    first = texts.text([NodeSnapshot.of(v, NOW) for v in nodes], now=NOW)
    assert texts.written == 2
    assert first == "\n".join(fleet_metrics(nodes, now=NOW)) + "\n"

    # Nothing came since: every node's text is the kept one.
    assert texts.text([NodeSnapshot.of(v, NOW) for v in nodes], now=NOW) == first
    assert texts.written == 2

    # n2's heartbeat replaced its cards (new objects): n2 alone is written again.
    facts = nodes[1].facts
    assert facts is not None
    nodes[1].live.gpus = [dataclasses.replace(facts.gpus[0], temperature=75)]
    third = texts.text([NodeSnapshot.of(v, NOW) for v in nodes], now=NOW)
    assert texts.written == 3
    assert sample(third, "llmgw_gpu_temperature_celsius", 'node="n2"') == "75"
    assert sample(third, "llmgw_gpu_temperature_celsius", 'node="n1"') == "61"

    # A node gone is forgotten; one silent past a minute has only its up sample.
    quiet = NodeSnapshot.of(nodes[0], NOW + 120)
    fourth = texts.text([quiet], now=NOW + 120)
    assert texts.written == 4
    assert 'node="n2"' not in fourth
    assert [line for line in fourth.splitlines() if 'node="n1"' in line] == [
        'llmgw_node_up{node="n1"} 1'
    ]

    # Fleet detail turned off forgets them all: the next scrape writes each again.
    texts.clear()
    texts.text([quiet], now=NOW + 120)
    assert texts.written == 5


def test_a_cards_steady_part_is_kept_while_only_its_figures_move() -> None:
    node = view("n1", NOW)
    sample_ = exposition.sample(NodeSnapshot.of(node, NOW))
    moving, steady = metricstext.moving_text(sample_), metricstext.steady_text(sample_)
    # Each family is written by one part: the steady one by the steady part alone.
    for at, (m, s) in enumerate(zip(moving, steady, strict=True)):
        assert not (m and s)
        assert not s or at in metricstext.STEADY
        assert not m or at not in metricstext.STEADY
    assert metricstext.merged(moving, steady) == metricstext.node_text(sample_)

    texts = NodeTexts()
    texts.text([NodeSnapshot.of(node, NOW)], now=NOW)
    assert (texts.written, texts.steady_written) == (1, 1)
    facts = node.facts
    assert facts is not None

    def beat(**changes: object) -> str:
        node.live.gpus = [dataclasses.replace(facts.gpus[0], **changes)]
        text = texts.text([NodeSnapshot.of(node, NOW)], now=NOW)
        assert text == "\n".join(fleet_metrics([node], now=NOW)) + "\n"
        return text

    # Figures moved (new card objects, the same facts): the steady part is kept.
    text = beat(temperature=75, power=600.0, throttle=[])
    assert (texts.written, texts.steady_written) == (2, 1)
    assert sample(text, "llmgw_gpu_temperature_celsius") == "75"
    assert sample(text, "llmgw_gpu_throttled", 'reason="sw_power_cap"') == "0"
    assert sample(text, "llmgw_gpu_info", 'driver="580.105.08"') == "1"
    # A figure that seldom moves did (the PCIe link in use): written again.
    text = beat(temperature=75, pcie_width=16)
    assert (texts.written, texts.steady_written) == (3, 2)
    assert sample(text, "llmgw_gpu_pcie_link_width") == "16"
    # The cards' health read again (a new record): written again.
    node.live.gpu_health = [dataclasses.replace(node.live.gpu_health[0], nvlink_active=18)]
    text = beat(temperature=75, pcie_width=16)
    assert (texts.written, texts.steady_written) == (4, 3)
    assert sample(text, "llmgw_gpu_nvlink_links_active") == "18"


def test_throttle_reasons_known_and_new() -> None:
    def reasons(throttle: list[str]) -> dict[str, str | None]:
        node = view("n1", NOW)
        facts = node.facts
        assert facts is not None
        node.live.gpus = [dataclasses.replace(facts.gpus[0], throttle=throttle)]
        text = "\n".join(fleet_metrics([node], now=NOW))
        lines = [line for line in text.splitlines() if line.startswith("llmgw_gpu_throttled{")]
        return {line.split('reason="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in lines}

    known = reasons(["hw_slowdown"])
    assert sorted(known) == sorted(THROTTLE_REASONS)
    assert known["hw_slowdown"] == "1" and known["gpu_idle"] == "0"
    # A reason this version does not know is written too, in its place among the others.
    new = reasons(["hw_slowdown", "a_new_reason"])
    assert list(new) == sorted([*THROTTLE_REASONS, "a_new_reason"])
    assert new["a_new_reason"] == "1" and new["hw_slowdown"] == "1" and new["gpu_idle"] == "0"


def test_without_fleet_detail_only_each_nodes_up_sample() -> None:
    text = up_metrics([("n2", False), ("n1", True)])
    assert text.splitlines() == [
        "# HELP llmgw_node_up 1 while the node is Ready, 0 when it is not.",
        "# TYPE llmgw_node_up gauge",
        'llmgw_node_up{node="n1"} 1',
        'llmgw_node_up{node="n2"} 0',
    ]
