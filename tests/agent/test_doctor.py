"""The doctor's hardware and clock checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from llmgw.agent.doctor import (
    Check,
    clock_check,
    cpu_check,
    disk_checks,
    hardware_checks,
    memory_check,
    nvidia_check,
    parse_chronyc_tracking,
    parse_ntpq_peers,
)
from llmgw.wire.hardware import GPU, Disk, HostFacts

GiB = 1 << 30

GOOD = HostFacts(
    hostname="gpu-07",
    os="Ubuntu 24.04.1 LTS",
    arch="x86_64",
    cpu_model="AMD EPYC 9654 96-Core Processor",
    cpu_count=192,
    cpu_cores=96,
    cpu_flags=["avx", "fma", "avx2", "avx512f"],
    memory_total=int(31.2 * GiB),
    memory_available=int(12.3 * GiB),
    disks=[Disk(path="/", fstype="ext4", total=1000 * GiB, free=500 * GiB)],
    gpus=[
        GPU(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", driver="550.54.15")
        for i in range(8)
    ],
    gpu_source="nvml",
)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_sound_node_is_all_ok_with_figures() -> None:
    checks = by_name(hardware_checks(GOOD))
    assert {c.status for c in checks.values()} == {"ok"}
    assert "AVX2 present (avx, fma, avx2, avx512f)" in checks["cpu"].detail
    assert "192 CPUs (96 cores)" in checks["cpu"].detail
    assert checks["memory"].detail == "12.3 GiB of 31.2 GiB available"
    assert checks["disk /"].detail == "500.0 GiB free of 1000.0 GiB (50%), ext4"
    assert checks["nvidia"].detail == (
        "8 cards: 8x NVIDIA H100 80GB HBM3; driver 550.54.15 (read by nvml)"
    )


def test_x86_without_avx2_warns_with_the_vm_fix() -> None:
    check = cpu_check(replace(GOOD, cpu_flags=["sse4_2", "avx"]))
    assert check.status == "warn"
    assert "no AVX2 (found: sse4_2, avx)" in check.detail
    assert "several times slower" in check.detail
    assert check.fix is not None and "-cpu host" in check.fix


def test_x86_flags_not_read_warns() -> None:
    check = cpu_check(replace(GOOD, cpu_flags=[]))
    assert check.status == "warn" and check.fix


def test_aarch64_with_neon_is_ok() -> None:
    check = cpu_check(replace(GOOD, arch="aarch64", cpu_flags=["asimd", "sve2", "i8mm"]))
    assert (check.status, check.detail.endswith("NEON present (asimd, sve2, i8mm)")) == ("ok", True)


def test_low_memory_warns_with_figures_and_fix() -> None:
    check = memory_check(replace(GOOD, memory_available=2 * GiB, memory_total=16 * GiB))
    assert check.status == "warn"
    assert check.detail.startswith("2.0 GiB of 16.0 GiB available")
    assert check.fix


def test_memory_not_read_warns() -> None:
    check = memory_check(replace(GOOD, memory_available=None, memory_total=None))
    assert (check.status, check.detail) == ("warn", "memory not read")


@pytest.mark.parametrize(
    ("total", "free", "status"),
    [
        (1000 * GiB, 500 * GiB, "ok"),
        (1000 * GiB, 60 * GiB, "warn"),  # 6 %: under 10 %
        (40 * GiB, 4 * GiB, "warn"),  # 10 % but under 5 GiB
        (100 * GiB, GiB // 2, "fail"),
    ],
)
def test_disk_thresholds(total: int, free: int, status: str) -> None:
    disk = Disk(path="/data", fstype="xfs", total=total, free=free)
    (check,) = disk_checks(replace(GOOD, disks=[disk]))
    assert check.name == "disk /data"
    assert check.status == status
    assert (check.fix is None) == (status == "ok")


def test_shared_disk_says_so() -> None:
    disk = Disk(path="/shared", fstype="nfs4", total=4096 * GiB, free=2048 * GiB, shared=True)
    (check,) = disk_checks(replace(GOOD, disks=[disk]))
    assert check.detail == "2.0 TiB free of 4.0 TiB (50%), nfs4, shared"


def test_disks_not_read_carry_discovery_s_reason() -> None:
    facts = replace(
        GOOD,
        disks=None,
        warnings=["disk: no answer in 5 s reading /srv. Fix: look for a hung network mount"],
    )
    (check,) = disk_checks(facts)
    assert (check.status, check.detail) == ("warn", "disk: no answer in 5 s reading /srv")
    assert check.fix == "look for a hung network mount"


def test_no_directory_yet_warns_rather_than_fails() -> None:
    (check,) = disk_checks(replace(GOOD, disks=[]))
    assert check.status == "warn" and check.fix


def test_no_nvidia_cards_is_ok() -> None:
    check = nvidia_check(replace(GOOD, gpus=[], gpu_source=None))
    assert (check.status, check.detail) == ("ok", "no NVIDIA cards")


def test_failing_nvidia_smi_warns_with_its_fix() -> None:
    warning = "nvidia-smi: failed (exit 9): NVIDIA-SMI has failed. Fix: reboot after the upgrade"
    check = nvidia_check(replace(GOOD, gpus=[], gpu_source=None, warnings=[warning]))
    assert check.status == "warn"
    assert check.detail == "no NVIDIA cards; nvidia-smi: failed (exit 9): NVIDIA-SMI has failed"
    assert check.fix == "reboot after the upgrade"


def test_every_warning_and_failure_says_its_fix() -> None:
    bad = replace(
        GOOD,
        cpu_flags=["avx"],
        memory_available=GiB,
        disks=[Disk(path="/", fstype="ext4", total=100 * GiB, free=0)],
        warnings=["NVML: could not start (Unknown Error). Fix: run nvidia-smi", "odd: thing"],
    )
    checks = hardware_checks(bad)
    assert {c.name for c in checks if c.status != "ok"} == {
        "cpu",
        "memory",
        "disk /",
        "nvidia",
        "discovery",
    }
    assert all(c.fix for c in checks if c.status != "ok")


# -- the clock -------------------------------------------------------------------------

CHRONY_SYNCED = """Reference ID    : A9FEA97B (169.254.169.123)
Stratum         : 4
Ref time (UTC)  : Mon Nov 30 09:12:03 2026
System time     : 0.000012345 seconds fast of NTP time
Last offset     : +0.000003811 seconds
RMS offset      : 0.000021337 seconds
Frequency       : 3.129 ppm slow
Leap status     : Normal
"""
CHRONY_UNSYNCED = CHRONY_SYNCED.replace(
    "Leap status     : Normal", "Leap status     : Not synchronised"
)
NTPQ_HEADER = (
    "     remote           refid      st t when poll reach   delay   offset  jitter\n"
    "==============================================================================\n"
)
NTPQ_SYNCED = (
    NTPQ_HEADER + "*192.0.2.10      .GPS.            1 u   33   64  377    0.412   -0.021   0.013\n"
)
NTPQ_UNSYNCED = (
    NTPQ_HEADER + " 192.0.2.10      .INIT.          16 u    -   64    0    0.000    0.000   0.000\n"
)


class FakeTools:
    def __init__(self, answers: dict[str, tuple[int, str] | None]) -> None:
        self.answers = answers
        self.ran: list[str] = []

    def which(self, tool: str) -> str | None:
        return f"/usr/bin/{tool}" if tool in self.answers else None

    def run(self, args: Sequence[str]) -> tuple[int, str] | None:
        self.ran.append(args[0])
        return self.answers[args[0]]


@pytest.mark.parametrize(
    ("answers", "status", "said", "ran"),
    [
        ({"timedatectl": (0, "yes\n")}, "ok", "clock synchronised (timedatectl)", ["timedatectl"]),
        (
            {"timedatectl": (0, "no\n")},
            "warn",
            "clock not synchronised (timedatectl)",
            ["timedatectl"],
        ),
        # No systemd (a container): timedatectl fails and chronyc answers.
        (
            {"timedatectl": (1, ""), "chronyc": (0, CHRONY_SYNCED)},
            "ok",
            "clock synchronised (chronyc)",
            ["timedatectl", "chronyc"],
        ),
        (
            {"chronyc": (0, CHRONY_UNSYNCED)},
            "warn",
            "clock not synchronised (chronyc)",
            ["chronyc"],
        ),
        (
            {"chronyc": None, "ntpq": (0, NTPQ_SYNCED)},
            "ok",
            "clock synchronised (ntpq)",
            ["chronyc", "ntpq"],
        ),
        ({"ntpq": (0, NTPQ_UNSYNCED)}, "warn", "clock not synchronised (ntpq)", ["ntpq"]),
        ({}, "warn", "could not tell whether the clock is synchronised", []),
    ],
)
def test_clock(
    answers: dict[str, tuple[int, str] | None], status: str, said: str, ran: list[str]
) -> None:
    tools = FakeTools(answers)
    check = clock_check(run=tools.run, which=tools.which)
    assert check.name == "clock"
    assert check.status == status
    assert check.detail.startswith(said)
    assert tools.ran == ran
    if status != "ok":
        assert check.fix
        assert "TLS certificates" in check.detail


def test_clock_parsers_tell_unknown_apart() -> None:
    assert parse_chronyc_tracking("506 Cannot talk to daemon\n") is None
    assert parse_ntpq_peers(NTPQ_HEADER) is None


def test_clock_check_on_this_machine_never_fails() -> None:
    assert clock_check().status in {"ok", "warn"}
