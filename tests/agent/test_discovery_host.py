"""Host discovery: cpuinfo and os-release parsing, the AVX2 warning, the CPU meter."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from llmgw.agent.discovery import (
    AVX2_FIX,
    CpuMeter,
    cpu_warnings,
    is_x86,
    normalise_arch,
    parse_cpuinfo,
    parse_os_release,
    read_host,
)
from llmgw.agent.discovery.host import read_cpu

FIXTURES = Path(__file__).parent / "fixtures"


def cpuinfo(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_xeon_counts_model_and_only_vector_flags() -> None:
    cpu = parse_cpuinfo(cpuinfo("cpuinfo_x86_xeon-gold-6230_2socket-ht.txt"), "x86_64")
    assert cpu.model == "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"
    assert cpu.logical == 8
    # 2 sockets x 2 cores; the hyper-threads share (physical id, core id).
    assert cpu.cores == 4
    assert cpu.flags == (
        "sse4_2",
        "avx",
        "f16c",
        "fma",
        "bmi2",
        "avx2",
        "avx512f",
        "avx512cd",
        "avx512dq",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
    )
    assert not cpu.hypervisor
    assert cpu_warnings("x86_64", cpu) == []


def test_qemu_cpu_without_avx2_warns_with_the_vm_fix() -> None:
    cpu = parse_cpuinfo(cpuinfo("cpuinfo_x86_qemu-virtual-cpu_no-avx2.txt"), "x86_64")
    assert cpu.model == "QEMU Virtual CPU version 2.5+"
    assert cpu.flags == ()
    assert cpu.hypervisor
    (warning,) = cpu_warnings("x86_64", cpu)
    assert warning.startswith("CPU: no AVX2 (vector extensions found: none)")
    assert "several times slower" in warning
    assert "this is a virtual machine" in warning
    assert "-cpu host" in warning and "host-passthrough" in warning


def test_bare_metal_cpu_without_avx2_warns_without_calling_it_a_vm() -> None:
    cpu = parse_cpuinfo(cpuinfo("cpuinfo_x86_xeon-e5-2670_avx-no-avx2.txt"), "x86_64")
    assert cpu.flags == ("sse4_2", "avx")
    (warning,) = cpu_warnings("x86_64", cpu)
    assert "found: sse4_2, avx" in warning
    assert "this is a virtual machine" not in warning
    assert AVX2_FIX in warning


def test_grace_aarch64_model_from_part_and_features() -> None:
    text = cpuinfo("cpuinfo_aarch64_grace-neoverse-v2.txt")
    cpu = parse_cpuinfo(text, "aarch64")
    assert cpu.model == "Arm Neoverse V2"
    assert cpu.logical == 4
    assert cpu.cores is None  # aarch64 cpuinfo has no core ids; psutil fills it in
    assert cpu.flags == (
        "asimd",
        "asimdhp",
        "asimddp",
        "fphp",
        "i8mm",
        "bf16",
        "sve",
        "sve2",
        "svei8mm",
        "svebf16",
    )
    # No AVX2 warning off x86.
    assert cpu_warnings("aarch64", cpu) == []


def test_unknown_arm_part_is_named_by_vendor_and_code() -> None:
    text = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0xc0\nCPU part\t: 0xac3\n"
    assert parse_cpuinfo(text, "aarch64").model == "Ampere CPU part 0xac3"


def test_empty_cpuinfo_reads_as_absent_not_zero() -> None:
    cpu = parse_cpuinfo("", "x86_64")
    assert (cpu.model, cpu.logical, cpu.cores, cpu.flags) == (None, None, None, ())


def test_unreadable_cpuinfo_falls_back_to_psutil_counts(tmp_path: Path) -> None:
    cpu = read_cpu("x86_64", tmp_path / "no-such-cpuinfo")
    assert cpu.model is None
    assert cpu.logical is not None and cpu.logical >= 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'NAME="Debian GNU/Linux"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n',
            "Debian GNU/Linux 12 (bookworm)",
        ),
        ("PRETTY_NAME='Rocky Linux 9.4 (Blue Onyx)'\n", "Rocky Linux 9.4 (Blue Onyx)"),
        ('# comment\nNAME="Ubuntu"\nVERSION_ID="24.04"\n', "Ubuntu 24.04"),
        ('PRETTY_NAME="Broken\n', "Broken"),
        ("ID=alpine\n", None),
    ],
)
def test_os_release(text: str, expected: str | None) -> None:
    assert parse_os_release(text) == expected


def test_arch_names_are_normalised() -> None:
    assert normalise_arch("AMD64") == "x86_64"
    assert normalise_arch("arm64") == "aarch64"
    assert is_x86("amd64") and not is_x86("aarch64")


def test_cpu_meter_measures_between_samples_and_not_before() -> None:
    readings = iter([(10.0, 100.0), (60.0, 200.0), (61.0, 201.0), (161.0, 301.0)])
    times = iter([0.0, 1.0, 1.01, 2.0])
    meter = CpuMeter(read=lambda: next(readings), clock=lambda: next(times))
    assert meter.sample() == 50.0  # 50 busy of 100 since the priming sample
    assert meter.sample() is None  # 10 ms later: too short a window to mean anything
    assert meter.sample() == 100.0


def test_cpu_meter_unreadable_times_are_absent_not_zero() -> None:
    def unreadable() -> tuple[float, float]:
        raise OSError("no /proc/stat")

    assert CpuMeter(read=unreadable).sample() is None


def test_read_host_on_this_machine() -> None:
    host = read_host()
    assert host.arch == normalise_arch(platform.machine())
    assert host.os and host.os != "unknown"
    assert host.memory_total and host.memory_available is not None
    assert 0 < host.memory_available <= host.memory_total
    assert host.cpu.logical and host.cpu.logical >= 1
    assert host.load is not None and len(host.load) == 3
