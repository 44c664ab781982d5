"""Slurm's outputs read into records: the recorded files in ../shared/fixtures (Slurm
23.11 to 26.05, other clusters) and this machine's own 22.05.8 in tests/fixtures/slurm."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmgw.agent.slurmread import (
    SlurmReadError,
    parse_end,
    parse_node,
    parse_nodes,
    parse_slurmd_c,
    parse_squeue,
    parse_version,
    version_ok,
)
from llmgw.wire.messages import SlurmdFacts, SlurmJob

# The team's recorded outputs, beside the repository (../shared/fixtures).
SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
OURS = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def shared(name: str) -> str:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"the shared fixtures are not here ({path})")
    return path.read_text()


def ours(name: str) -> str:
    return (OURS / name).read_text()


def test_slurmd_c_of_this_machine_skips_uptime() -> None:
    facts = parse_slurmd_c(ours("slurmd-C_vm_slurm-22.05.8.txt"))
    assert facts == SlurmdFacts(
        cpus=2,
        boards=1,
        sockets_per_board=1,
        cores_per_socket=2,
        threads_per_core=1,
        real_memory=24105,
        gres=None,
    )


def test_slurmd_c_with_autodetected_gpus_skips_the_found_line() -> None:
    facts = parse_slurmd_c(shared("slurmd-C_8xA100-SXM4-80GB_autodetect-nvidia_slurm-25.11.txt"))
    assert facts.cpus == 128
    assert (facts.sockets_per_board, facts.cores_per_socket, facts.threads_per_core) == (2, 32, 2)
    assert facts.real_memory == 2063878
    assert facts.gres == "gpu:nvidia_a100-sxm4-80gb:8"


def test_slurmd_c_without_a_node_line_is_an_error() -> None:
    with pytest.raises(SlurmReadError, match="NodeName"):
        parse_slurmd_c("UpTime=0-09:31:40\n")


def test_h100_node_multi_line_keeps_os_with_spaces() -> None:
    node = parse_node(shared("scontrol-show-node_8xH100-HGX_slurm-23.11.11.txt"))
    assert node.name == "hgpn01"
    assert node.state == "MIXED"
    assert node.gres == "gpu:H100:8(S:0-1)"
    assert node.version == "23.11.11"
    assert node.cpus == 112
    assert node.real_memory == 1900000
    assert node.reason is None
    assert not node.drained


def test_every_record_of_the_one_line_listing() -> None:
    nodes = parse_nodes(shared("scontrol-show-nodes-o_slurm-26.05.2_docker-testcluster.txt"))
    assert len(nodes) == 20
    by_name = {n.name: n for n in nodes}
    assert by_name["na1"].partitions == ("cpu", "debug", "high")
    assert by_name["na1"].state == "MIXED+DYNAMIC_NORM"
    assert by_name["nb9"].gres == "gpu:model_a:2,gpu:model_b:2"
    assert by_name["na6"].address == "172.18.0.8"
    assert all(n.version == "26.05.2" for n in nodes)


def test_slinky_record_with_trailing_spaces_and_a_json_comment() -> None:
    node = parse_node(shared("scontrol-show-nodes_A40-slinky-k8s_slurm-25.05.2_one-record.txt"))
    assert node.name == "esc8000a-1"
    assert node.gres == "gpu:a40:1(S:0,2,4,6,8,10)"
    assert node.state == "IDLE+DYNAMIC_NORM"
    assert node.partitions == ("tn",)


@pytest.mark.parametrize("form", ["scontrol-show-node", "scontrol-show-node-o"])
def test_both_forms_of_this_machine_read_alike(form: str) -> None:
    idle = parse_node(ours(f"{form}_idle_22.05.8.txt"))
    assert (idle.name, idle.state, idle.reason, idle.drained) == ("n1", "IDLE", None, False)
    assert idle.version == "22.05.8"
    mixed = parse_node(ours(f"{form}_mixed_22.05.8.txt"))
    assert mixed.state == "MIXED"
    ours_drain = parse_node(ours(f"{form}_drained-llmgw_22.05.8.txt"))
    assert ours_drain.state == "IDLE+DRAIN"
    assert ours_drain.drained
    # The "[root@2026-...]" tail is who and when, not the reason.
    assert ours_drain.reason == "llmgw: reclaimed"
    admin = parse_node(ours(f"{form}_drained-admin_22.05.8.txt"))
    assert admin.drained
    assert admin.flags == ("IDLE", "DRAIN", "NOT_RESPONDING")
    assert admin.reason == "maintenance: swap PSU, ticket 42"


def test_a_reason_holding_an_equals_sign_is_kept_whole() -> None:
    text = ours("scontrol-show-node-o_drained-llmgw_22.05.8.txt").replace(
        "llmgw: reclaimed", "bad dimm slot=3 see ticket"
    )
    assert parse_node(text).reason == "bad dimm slot=3 see ticket"


def test_no_record_is_an_error() -> None:
    with pytest.raises(SlurmReadError):
        parse_node("Node n9 not found\n")


def test_squeue_running_job_has_its_end_in_local_time() -> None:
    jobs = parse_squeue(ours("squeue_running_22.05.8.txt"))
    want = time.mktime(time.strptime("2026-12-06T06:58:16", "%Y-%m-%dT%H:%M:%S"))
    assert jobs == [SlurmJob(id="1", name="sleep job", user="root", state="RUNNING", end=want)]


def test_squeue_unlimited_and_empty() -> None:
    assert parse_squeue(ours("squeue_nolimit_22.05.8.txt")) == [
        SlurmJob(id="2", name="nolimit", user="root", state="RUNNING", end=None)
    ]
    assert parse_squeue(ours("squeue_empty_22.05.8.txt")) == []


@pytest.mark.parametrize("value", ["N/A", "Unknown", "NONE"])
def test_no_known_end(value: str) -> None:
    assert parse_end(value) is None


def test_squeue_name_with_a_bar_and_bad_lines() -> None:
    jobs = parse_squeue("7|a|b|alice|PENDING|N/A\n")
    assert jobs[0].name == "a|b"
    assert jobs[0].user == "alice"
    with pytest.raises(SlurmReadError):
        parse_squeue("7|RUNNING\n")


def test_versions() -> None:
    assert parse_version(ours("slurmd-V_slurm-22.05.8.txt")) == "22.05.8"
    assert parse_version("slurm 23.11.4\n") == "23.11.4"
    assert parse_version("command not found") is None
    assert version_ok("22.05.8")
    assert version_ok("23.11.4")
    assert version_ok("26.05.2")
    assert not version_ok("21.08.8")
    assert not version_ok("20.11.9")
