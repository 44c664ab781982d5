"""read_hwmon and RaplMeter against fake sysfs trees built under tmp_path: plain
directories where the kernel has symlinks, and a directory where a file should be
when a read must fail (root ignores chmod, a directory refuses read_text for all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.discovery.vitals import HwmonReading, RaplMeter, read_hwmon


def hwmon(root: Path, n: int, name: str, temps: dict[int, tuple[str | None, str]]) -> Path:
    """hwmon<n> with ``name`` and, per input number, (label or None, raw input text)."""
    d = root / f"hwmon{n}"
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    for i, (label, raw) in temps.items():
        (d / f"temp{i}_input").write_text(raw + "\n")
        if label is not None:
            (d / f"temp{i}_label").write_text(label + "\n")
    return d


def test_two_socket_coretemp_gives_packages_not_cores(tmp_path: Path) -> None:
    hwmon(
        tmp_path,
        2,
        "coretemp",
        {1: ("Package id 0", "61000"), 2: ("Core 0", "58000"), 3: ("Core 1", "63000")},
    )
    hwmon(tmp_path, 3, "coretemp", {1: ("Package id 1", "54500"), 2: ("Core 0", "52000")})
    reading = read_hwmon(tmp_path)
    assert reading.cpu == {"package0": 61.0, "package1": 54.5}
    assert reading.board == {}


def test_k10temp_prefers_tdie_and_counts_sockets(tmp_path: Path) -> None:
    hwmon(tmp_path, 0, "k10temp", {1: ("Tctl", "72125"), 3: ("Tccd1", "66000")})
    hwmon(tmp_path, 1, "k10temp", {1: ("Tctl", "80000"), 2: ("Tdie", "53000")})
    hwmon(tmp_path, 4, "zenpower", {1: (None, "40000")})  # unlabelled temp1: Tctl
    assert read_hwmon(tmp_path).cpu == {"package0": 72.125, "package1": 53.0, "package2": 40.0}


def test_hwmon_order_is_numeric_not_lexical(tmp_path: Path) -> None:
    hwmon(tmp_path, 10, "k10temp", {1: ("Tctl", "50000")})
    hwmon(tmp_path, 9, "k10temp", {1: ("Tctl", "60000")})
    assert read_hwmon(tmp_path).cpu == {"package0": 60.0, "package1": 50.0}


def test_board_sensors_kept_devices_left_out(tmp_path: Path) -> None:
    hwmon(tmp_path, 0, "acpitz", {1: (None, "27800"), 2: (None, "29800")})
    hwmon(tmp_path, 1, "nvme", {1: ("Composite", "39850"), 2: ("Sensor 1", "39850")})
    hwmon(tmp_path, 2, "nct6798", {1: ("SYSTIN", "33000"), 2: ("CPUTIN", "41500")})
    hwmon(tmp_path, 3, "amdgpu", {1: ("edge", "45000")})
    hwmon(tmp_path, 4, "pch_cannonlake", {1: (None, "48000")})
    hwmon(tmp_path, 5, "acpitz", {1: (None, "16800")})
    hwmon(tmp_path, 6, "mlx5", {1: ("asic", "55000")})
    hwmon(tmp_path, 7, "iwlwifi_1", {1: (None, "41000")})
    hwmon(tmp_path, 8, "drivetemp", {1: (None, "35000")})
    reading = read_hwmon(tmp_path)
    assert reading.cpu == {}
    assert reading.board == {
        "acpitz/temp1": 27.8,
        "acpitz/temp2": 29.8,
        "nct6798/SYSTIN": 33.0,
        "nct6798/CPUTIN": 41.5,
        "pch_cannonlake/temp1": 48.0,
        "acpitz.1/temp1": 16.8,
    }


def test_arm_cpu_thermal_zone(tmp_path: Path) -> None:
    hwmon(tmp_path, 0, "cpu_thermal", {1: (None, "47236")})
    hwmon(tmp_path, 1, "gpu_thermal", {1: (None, "44000")})
    assert read_hwmon(tmp_path) == HwmonReading(cpu={"cpu_thermal": 47.236}, board={})


def test_unreadable_and_absurd_inputs_are_not_read(tmp_path: Path) -> None:
    d = hwmon(
        tmp_path,
        0,
        "nct6775",
        {
            2: ("AUXTIN0", "-128000"),  # an unwired Super I/O input
            3: ("AUXTIN1", "255000"),
            4: ("AUXTIN2", "garbage"),
            5: ("PECI Agent 0", "39000"),
        },
    )
    (d / "temp1_input").mkdir()  # reading it raises IsADirectoryError
    (d / "temp1_label").write_text("SYSTIN\n")
    hwmon(tmp_path, 1, "coretemp", {1: ("Package id 0", "151000"), 2: ("Core 0", "40000")})
    reading = read_hwmon(tmp_path)
    assert reading.board == {"nct6775/PECI Agent 0": 39.0}
    assert reading.cpu == {}


def test_legacy_layout_under_device(tmp_path: Path) -> None:
    d = tmp_path / "hwmon0"
    (d / "device").mkdir(parents=True)
    (d / "device" / "name").write_text("it8728\n")
    (d / "device" / "temp1_input").write_text("36000\n")
    assert read_hwmon(tmp_path).board == {"it8728/temp1": 36.0}


def test_nothing_there(tmp_path: Path) -> None:
    assert read_hwmon(tmp_path / "absent") == HwmonReading(cpu={}, board={})
    (tmp_path / "hwmon0").mkdir()  # no name: skipped
    (tmp_path / "hwmon0" / "temp1_input").write_text("40000\n")
    assert read_hwmon(tmp_path) == HwmonReading()


# --- RAPL -------------------------------------------------------------------------


def zone(root: Path, dirname: str, name: str, energy: int | None, wrap: int | None) -> Path:
    d = root / dirname
    d.mkdir(parents=True, exist_ok=True)
    (d / "name").write_text(name + "\n")
    if energy is None:
        (d / "energy_uj").mkdir()  # as unreadable as a root-only file is to a user
    else:
        set_energy(d, energy)
    if wrap is not None:
        (d / "max_energy_range_uj").write_text(f"{wrap}\n")
    return d


def set_energy(d: Path, energy: int) -> None:
    (d / "energy_uj").write_text(f"{energy}\n")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rapl_packages_power_and_first_sample_empty(tmp_path: Path) -> None:
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000, 262143328850)
    p1 = zone(tmp_path, "intel-rapl:1", "package-1", 5_000_000, 262143328850)
    core = zone(tmp_path, "intel-rapl:0:0", "core", 10, 262143328850)
    dram = zone(tmp_path, "intel-rapl:0:1", "dram", 10, 262143328850)
    zone(tmp_path, "intel-rapl:2", "psys", 10, 262143328850)
    clock = Clock()
    meter = RaplMeter(tmp_path, clock)
    assert meter.sample() == {}
    clock.t += 2.0
    set_energy(p0, 1_000_000 + 300_000_000)  # 300 J in 2 s
    set_energy(p1, 5_000_000 + 250_500_000)
    set_energy(core, 999_999_999)
    set_energy(dram, 999_999_999)
    assert meter.sample() == {"package0": 150.0, "package1": 125.25}
    assert meter.sample(now=clock.t + 1.0) == {"package0": 0.0, "package1": 0.0}


def test_rapl_wraparound_corrected(tmp_path: Path) -> None:
    wrap = 262143328850
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", wrap - 100_000_000, wrap)
    meter = RaplMeter(tmp_path, Clock())
    assert meter.sample(now=0.0) == {}
    set_energy(p0, 200_000_000)  # 100 J before the wrap, 200 J after
    assert meter.sample(now=1.0) == {"package0": 300.0}


def test_rapl_backwards_without_range_is_not_read(tmp_path: Path) -> None:
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 500_000_000, None)
    meter = RaplMeter(tmp_path, Clock())
    meter.sample(now=0.0)
    set_energy(p0, 100_000_000)
    assert meter.sample(now=1.0) == {}
    set_energy(p0, 150_000_000)  # the backwards read became the new baseline
    assert meter.sample(now=2.0) == {"package0": 50.0}


def test_rapl_permission_denied_package_absent(tmp_path: Path) -> None:
    zone(tmp_path, "intel-rapl:0", "package-0", None, 262143328850)
    p1 = zone(tmp_path, "intel-rapl:1", "package-1", 0, 262143328850)
    meter = RaplMeter(tmp_path, Clock())
    assert meter.sample(now=0.0) == {}
    set_energy(p1, 80_000_000)
    assert meter.sample(now=1.0) == {"package1": 80.0}


def test_rapl_too_soon_keeps_baseline(tmp_path: Path) -> None:
    p0 = zone(tmp_path, "intel-rapl:0", "package-0", 0, 262143328850)
    meter = RaplMeter(tmp_path, Clock())
    meter.sample(now=10.0)
    set_energy(p0, 1_000_000)
    assert meter.sample(now=10.01) == {}
    set_energy(p0, 100_000_000)
    assert meter.sample(now=11.0) == {"package0": pytest.approx(100.0)}


def test_rapl_no_tree(tmp_path: Path) -> None:
    meter = RaplMeter(tmp_path / "powercap")
    assert meter.sample() == {}
    assert meter.sample() == {}
