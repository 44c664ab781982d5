"""Host vitals from sysfs: CPU and board temperatures (hwmon) and CPU package power (RAPL).

Both readers touch the live system (blocking file reads), so the agent calls them
through ``asyncio.to_thread``; tests point them at a fake sysfs tree. Their contract:
a figure not read is left out (an absent key), never 0, and nothing here raises for a
missing or unreadable file.

Files read, and why each may be absent:

- ``/sys/class/hwmon/hwmonN/name``: the driver's name; it picks what the sensors are.
  Very old drivers keep it (and their ``temp*`` files) under ``hwmonN/device/``, which
  is read as well. The whole class is empty in most virtual machines and containers
  (no sensors are passed through) and where no sensor driver is loaded (``coretemp``
  not loaded, or ``k10temp`` older than the CPU).
- ``hwmonN/tempN_input``: millidegrees Celsius. Some sensors answer a read with an
  error (EIO, ENODATA) while their chip sleeps or was never wired; those are skipped,
  and so is a value outside -40..150 °C (an unwired input reads -128 or 255 on Super
  I/O chips).
- ``hwmonN/tempN_label``: what the input measures ("Package id 0", "Core 3", "Tctl");
  older kernels and many board chips have none.
- ``/sys/class/powercap/intel-rapl:N/{name,energy_uj,max_energy_range_uj}``: RAPL
  package energy. The tree is absent in virtual machines, on CPUs without RAPL and on
  AMD before the kernel learned Zen's RAPL (5.8; later for some families), and
  ``energy_uj`` is readable by root only since the PLATYPUS fix (CVE-2020-8694: 5.10
  and the stable kernels it was backported to), so an unprivileged agent reads no power.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Outside these a hwmon input is broken or unwired, not hot or cold.
MIN_C = -40.0
MAX_C = 150.0

# Drivers whose inputs are CPU package temperatures, and those whose are the board's.
# Anything else (NVMe drives, GPUs, NICs, Wi-Fi, SATA drives via drivetemp, PSUs) is
# left out: those devices are not the host's own and have their own readers.
_INTEL_CPU = frozenset({"coretemp"})
_AMD_CPU = frozenset({"k10temp", "zenpower"})
# Arm SoCs expose CPU thermal zones as hwmon devices named after the zone type.
_ARM_CPU = re.compile(r"^(?:cpu|bigcore|littlecore|cluster)\d*[_-]thermal$")
_BOARD = re.compile(
    r"^(?:acpitz|nct\d+\w*|it8\d+\w*|pch_\w+|w83\w+|f71\w+|asus\w*|dell_smm|thinkpad"
    r"|jc42|spd5118|lm\d+|sch5\d+\w*|emc\d+\w*|adt7\d+\w*)$"
)
_CORETEMP_PACKAGE = re.compile(r"^(?:Package|Physical) id (\d+)$")
_TEMP_INPUT = re.compile(r"^temp(\d+)_input$")
_HWMON_DIR = re.compile(r"^hwmon(\d+)$")
_RAPL_PACKAGE_DIR = re.compile(r"^intel-rapl:(\d+)$")  # intel-rapl:N:M are subzones
_RAPL_PACKAGE_NAME = re.compile(r"^package-(\d+)$")


@dataclass(frozen=True)
class HwmonReading:
    """Temperatures in °C by sensor name; a sensor not read is absent, never 0.

    ``cpu`` holds one figure per CPU package ("package0", "package1", ...) on x86 and
    one per CPU thermal zone on Arm (named after the zone, e.g. "cpu_thermal").
    ``board`` holds the mainboard's sensors as "<driver>/<label>", the label being
    ``tempN_label`` or "tempN" where there is none ("acpitz/temp1", "nct6798/SYSTIN");
    a second chip with the same driver name is "<driver>.1/<label>".
    """

    cpu: dict[str, float] = field(default_factory=dict)
    board: dict[str, float] = field(default_factory=dict)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except (OSError, ValueError):
        return None


def _celsius(path: Path) -> float | None:
    raw = _read(path)
    if raw is None:
        return None
    try:
        value = int(raw) / 1000.0
    except ValueError:
        return None
    return value if MIN_C <= value <= MAX_C else None


def _numbered(root: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """Entries of ``root`` whose names match ``pattern``, by the number it captures."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := pattern.match(p.name))]
    return sorted(found, key=lambda item: item[0])


def _temps(device: Path) -> Iterator[tuple[str | None, str, float]]:
    """(label, "tempN", °C) for each readable input of one hwmon device."""
    for n, path in _numbered(device, _TEMP_INPUT):
        value = _celsius(path)
        if value is not None:
            yield _read(device / f"temp{n}_label") or None, f"temp{n}", value


def _hwmon_devices(root: Path) -> Iterator[tuple[str, Path]]:
    """(driver name, directory holding its temp files) for each hwmonN, in N order."""
    for _, hwmon in _numbered(root, _HWMON_DIR):
        name = _read(hwmon / "name")
        legacy = hwmon / "device"
        if name is None:
            name = _read(legacy / "name")
        if not name:
            continue
        if not _numbered(hwmon, _TEMP_INPUT) and _numbered(legacy, _TEMP_INPUT):
            yield name, legacy
        else:
            yield name, hwmon


def read_hwmon(root: Path = Path("/sys/class/hwmon")) -> HwmonReading:
    """CPU package and board temperatures from the hwmon class; empty where none read.

    - ``coretemp`` (Intel): "Package id N" is "packageN"; "Core N" inputs are cores,
      not packages, and are left out.
    - ``k10temp`` / ``zenpower`` (AMD): one device per socket, numbered in hwmon order;
      "Tdie" is preferred over "Tctl" (Tctl carries a fan-control offset on some
      Threadrippers), and an unlabelled temp1 (kernels before 4.16) counts as Tctl.
    - Arm CPU thermal zones (``cpu_thermal``, ``cpu0_thermal``, ``bigcore0_thermal``):
      their first input, keyed by the zone's name.
    - Board chips (``acpitz``, Nuvoton ``nct*``, ITE ``it87``/``it8*``, ``pch_*``,
      Winbond, Fintek, DIMM sensors ``jc42``/``spd5118``, ...) go to ``board``.
    """
    cpu: dict[str, float] = {}
    board: dict[str, float] = {}
    amd_sockets = 0
    seen: dict[str, int] = {}
    for name, device in _hwmon_devices(root):
        temps = list(_temps(device))
        if name in _INTEL_CPU:
            for label, _, value in temps:
                m = _CORETEMP_PACKAGE.match(label or "")
                if m:
                    cpu.setdefault(f"package{m.group(1)}", value)
        elif name in _AMD_CPU:
            named = {label or key: value for label, key, value in temps}
            tdie = named.get("Tdie", named.get("Tctl", named.get("temp1")))
            if tdie is not None:
                cpu.setdefault(f"package{amd_sockets}", tdie)
            amd_sockets += 1
        elif _ARM_CPU.match(name):
            if temps:
                cpu.setdefault(name, temps[0][2])
        elif _BOARD.match(name):
            count = seen.get(name, 0)
            seen[name] = count + 1
            chip = name if count == 0 else f"{name}.{count}"
            for label, key, value in temps:
                board.setdefault(f"{chip}/{label or key}", value)
    return HwmonReading(cpu=cpu, board=board)


class RaplMeter:
    """CPU package power (W) from RAPL energy counters, between two samples.

    Reads each top-level ``intel-rapl:N`` zone whose ``name`` is "package-N" (the AMD
    driver on newer kernels fills the same tree); subzones (``intel-rapl:N:M``: core,
    uncore, dram) and other top-level zones (``psys``) are left out. ``sample`` gives
    watts per package ("package0") over the time since the previous sample:

    - the first sample of a package gives nothing for it: one read is no rate;
    - a counter that went backwards wrapped at ``max_energy_range_uj`` and is corrected
      by it; without that file the package is left out of that sample. Samples further
      apart than one wrap (minutes at full load) read low, which no counter can tell;
    - a package whose ``energy_uj`` cannot be read (root-only on current kernels) is
      absent, and its next readable sample starts afresh;
    - a sample taken less than ``MIN_INTERVAL`` seconds after the last gives nothing
      and keeps the earlier baseline.
    """

    MIN_INTERVAL = 0.05

    def __init__(
        self,
        root: Path = Path("/sys/class/powercap"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}

    def _packages(self) -> Iterator[tuple[str, Path]]:
        for _, zone in _numbered(self._root, _RAPL_PACKAGE_DIR):
            m = _RAPL_PACKAGE_NAME.match(_read(zone / "name") or "")
            if m:
                yield f"package{m.group(1)}", zone

    def sample(self, now: float | None = None) -> dict[str, float]:
        """Watts per package since the previous sample; {} on the first one."""
        t = self._clock() if now is None else now
        watts: dict[str, float] = {}
        for package, zone in self._packages():
            raw = _read(zone / "energy_uj")
            energy = int(raw) if raw is not None and raw.isdigit() else None
            if energy is None:
                self._last.pop(package, None)
                continue
            last = self._last.get(package)
            if last is not None and t - last[0] < self.MIN_INTERVAL:
                continue
            self._last[package] = (t, energy)
            if last is None:
                continue
            delta = energy - last[1]
            if delta < 0:
                wrap = _read(zone / "max_energy_range_uj")
                if wrap is None or not wrap.isdigit() or int(wrap) <= last[1]:
                    continue
                delta += int(wrap)
            watts[package] = round(delta / 1e6 / (t - last[0]), 2)
        return watts
