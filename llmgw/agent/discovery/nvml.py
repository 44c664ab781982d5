"""NVML behind an interface: the calls discovery makes, the real one (and a fake beside).

``NvmlSource`` is the seam: ``PynvmlSource`` calls the driver's library through
nvidia-ml-py (imported only when used, so a CPU node never loads it), ``FakeNvml``
(``nvmlfake``) stands in for it in tests, and ``cardread`` turns either into wire
records. Every call blocks; the agent runs them through ``asyncio.to_thread``.

The health figures go through one call, ``figure(index, name)``, one NVML query per
name (``FIGURES`` lists them with what each answers). A name the driver or card does
not support raises NvmlError and costs nothing else: each figure is read apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from ctypes import byref
from types import ModuleType
from typing import NotRequired, Protocol, TypeAlias, TypedDict, TypeVar

from llmgw.wire.warnings import THROTTLE_REASONS

_T = TypeVar("_T")

# pynvml's device, GPM sample and event set handles: ctypes pointers we only hand back.
Handle: TypeAlias = object

# Figure name -> what it answers (units as returned; cardread converts).
FIGURES: dict[str, str] = {
    "bus_id": "PCI bus id, '0000:19:00.0'",
    "memory_utilization": "percent of time memory was read or written",
    "temperature": "GPU temperature, C",
    "memory_temperature": "HBM temperature, C",
    "power": "draw, W",
    "power_limit": "enforced limit, W",
    "energy": "J since the driver loaded",
    "sm_clock": "MHz",
    "memory_clock": "MHz",
    "fan": "percent",
    "pstate": "performance state number, 0 fastest",
    "throttle": "clock event reasons bitmask (THROTTLE_BITS)",
    "pcie_gen": "PCIe generation in use",
    "pcie_width": "PCIe lanes in use",
    "pcie_gen_max": "most PCIe generation the card and host allow",
    "pcie_width_max": "most PCIe lanes the card and host allow",
    "pcie_gen_device_max": "most PCIe generation the card itself can run",
    "processes": "[(pid, used bytes or None)] of compute processes",
    "gpm": "{sm_active, sm_occupancy, tensor_active, dram_active} 0..1 since the last call",
    "mig_mode": "True when MIG is on (current mode)",
    "mig_instances": "[{uuid, memory_total, memory_used, gi_id, ci_id, profile}]",
    "persistence_mode": "True when on",
    "ecc_mode": "True when ECC is on (current mode)",
    "ecc_volatile_corrected": "count since the driver loaded",
    "ecc_volatile_uncorrected": "count since the driver loaded",
    "ecc_aggregate_corrected": "count over the card's life",
    "ecc_aggregate_uncorrected": "count over the card's life",
    "retired_pages": "pages retired (multiple single-bit + double-bit)",
    "retired_pending": "True when a retirement waits for a reset",
    "remapped_rows": "(correctable, uncorrectable, pending, failed)",
    "nvlink": "[(active, {counter: count})] per link the card has",
    "fabric": (
        "{state: 0..3 (NVML_GPU_FABRIC_STATE_*), status: 'Success' or NVML's error text, "
        "cluster_uuid: '8-4-4-4-12' hex, clique_id, health_mask (v2 on), "
        "health_summary (v3 on)}"
    ),
}

# NVML's fabric states, in nvidia-smi's words; 0 (not supported) is no fabric.
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}

# NVML's clock event (throttle) reason bits, in THROTTLE_REASONS' order: 0x1 is
# gpu_idle, 0x2 applications clocks, ... 0x100 display clocks.
THROTTLE_BITS: dict[int, str] = {1 << n: name for n, name in enumerate(THROTTLE_REASONS)}

NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")  # NVML counter 0..3
_NVLINK_MAX_LINKS = 18
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


class MigFigure(TypedDict):
    """One MIG instance of the ``mig_instances`` figure."""

    uuid: str
    memory_total: int
    memory_used: int
    gi_id: int
    ci_id: int
    profile: str | None


class FabricFigure(TypedDict):
    """The ``fabric`` figure: NVML's GPU fabric info."""

    state: int
    status: str
    cluster_uuid: str
    clique_id: int
    health_mask: NotRequired[int]
    health_summary: NotRequired[int]


def decode_throttle(mask: int) -> list[str]:
    """The active reasons in an NVML clock event mask; bits we do not know are left out."""
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


class NvmlError(Exception):
    """An NVML call failed (not supported on this card, card lost, driver fault...)."""


class NvmlUnavailable(NvmlError):
    """No NVML on this machine: no library or no driver loaded. Means "no cards"."""


class NvmlSource(Protocol):
    """The NVML calls discovery makes. Per-card calls raise NvmlError for "not read"."""

    def init(self) -> None:
        """Start NVML; NvmlUnavailable when there is none, NvmlError when it fails."""

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def cuda_version(self) -> str:
        """The CUDA version the driver supports, "12.4"."""

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str: ...

    def name(self, index: int) -> str: ...

    def memory(self, index: int) -> tuple[int, int]:
        """Total and used bytes."""

    def utilization(self, index: int) -> int:
        """Percent of the last sample period a kernel ran."""

    def compute_capability(self, index: int) -> tuple[int, int]: ...

    def figure(self, index: int, name: str) -> object:
        """One health figure of ``FIGURES``; NvmlError when not read. Its type is the
        name's (an int, a list of ``MigFigure``...); a reader checks what it got."""

    def xid_events(self) -> list[tuple[int, int]]:
        """(card index, Xid code) of each critical Xid since the last call, not waiting."""


def _text(value: object) -> str:
    # Older nvidia-ml-py releases returned bytes; newer ones decode.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PynvmlSource:
    """NVML through nvidia-ml-py's ``pynvml`` module."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._handles: dict[int, Handle] = {}
        self._events: Handle | None = None
        self._gpm: dict[int, Handle] = {}  # index -> the previous GPM sample

    def _call(self, fn: Callable[..., _T], *args: object) -> _T:
        nvml = self._started()
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            raise NvmlError(str(exc)) from exc
        except AttributeError as exc:  # a call this nvidia-ml-py does not have
            raise NvmlError(f"not in this nvidia-ml-py: {exc}") from exc

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            absent = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
            if getattr(exc, "value", None) in absent:
                raise NvmlUnavailable(str(exc)) from exc
            raise NvmlError(str(exc)) from exc
        self._nvml = pynvml
        self._handles = {}
        self._events = None
        self._gpm = {}

    def shutdown(self) -> None:
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            self._handles = {}
            try:
                for sample in self._gpm.values():
                    nvml.nvmlGpmSampleFree(sample)
                if self._events is not None:
                    nvml.nvmlEventSetFree(self._events)
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass  # shutting down a library that is already gone is no fault
            self._gpm, self._events = {}, None

    def _started(self) -> ModuleType:
        if self._nvml is None:
            raise NvmlError("NVML is not started")
        return self._nvml

    def _handle(self, index: int) -> Handle:
        nvml = self._started()
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def driver_version(self) -> str:
        return _text(self._call(self._started().nvmlSystemGetDriverVersion))

    def cuda_version(self) -> str:
        version = int(self._call(self._started().nvmlSystemGetCudaDriverVersion))
        return f"{version // 1000}.{version % 1000 // 10}"

    def device_count(self) -> int:
        return int(self._call(self._started().nvmlDeviceGetCount))

    def uuid(self, index: int) -> str:
        return _text(self._call(self._started().nvmlDeviceGetUUID, self._handle(index)))

    def name(self, index: int) -> str:
        return _text(self._call(self._started().nvmlDeviceGetName, self._handle(index)))

    def memory(self, index: int) -> tuple[int, int]:
        info = self._call(self._started().nvmlDeviceGetMemoryInfo, self._handle(index))
        return int(info.total), int(info.used)

    def utilization(self, index: int) -> int:
        rates = self._call(self._started().nvmlDeviceGetUtilizationRates, self._handle(index))
        return int(rates.gpu)

    def compute_capability(self, index: int) -> tuple[int, int]:
        major, minor = self._call(
            self._started().nvmlDeviceGetCudaComputeCapability, self._handle(index)
        )
        return int(major), int(minor)

    def figure(self, index: int, name: str) -> object:
        read: Callable[[ModuleType, Handle], object] | None = getattr(self, "_fig_" + name, None)
        if read is None:
            raise NvmlError(f"no figure {name!r}")
        return read(self._started(), self._handle(index))

    # --- one reader per figure; each makes the NVML calls for its figure only -------

    def _fig_bus_id(self, nv: ModuleType, h: Handle) -> str:
        return _text(self._call(nv.nvmlDeviceGetPciInfo, h).busId).lower()

    def _fig_memory_utilization(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetUtilizationRates, h).memory)

    def _fig_temperature(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU))

    def _fig_memory_temperature(self, nv: ModuleType, h: Handle) -> int:
        (value,) = self._call(nv.nvmlDeviceGetFieldValues, h, [nv.NVML_FI_DEV_MEMORY_TEMP])
        if value.nvmlReturn != nv.NVML_SUCCESS:
            raise NvmlError("memory temperature not supported")
        return int(value.value.uiVal)

    def _fig_power(self, nv: ModuleType, h: Handle) -> float:
        return int(self._call(nv.nvmlDeviceGetPowerUsage, h)) / 1000

    def _fig_power_limit(self, nv: ModuleType, h: Handle) -> float:
        return int(self._call(nv.nvmlDeviceGetEnforcedPowerLimit, h)) / 1000

    def _fig_energy(self, nv: ModuleType, h: Handle) -> float:
        return int(self._call(nv.nvmlDeviceGetTotalEnergyConsumption, h)) / 1000

    def _fig_sm_clock(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM))

    def _fig_memory_clock(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM))

    def _fig_fan(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetFanSpeed, h))

    def _fig_pstate(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetPerformanceState, h))

    def _fig_throttle(self, nv: ModuleType, h: Handle) -> int:
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if reasons is None:
            reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call(reasons, h))

    def _fig_pcie_gen(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h))

    def _fig_pcie_width(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetCurrPcieLinkWidth, h))

    def _fig_pcie_gen_max(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h))

    def _fig_pcie_width_max(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetMaxPcieLinkWidth, h))

    def _fig_pcie_gen_device_max(self, nv: ModuleType, h: Handle) -> int:
        return int(self._call(nv.nvmlDeviceGetGpuMaxPcieLinkGeneration, h))

    def _fig_processes(self, nv: ModuleType, h: Handle) -> list[tuple[int, int | None]]:
        found = self._call(nv.nvmlDeviceGetComputeRunningProcesses, h)
        out: list[tuple[int, int | None]] = []
        for p in found:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) if isinstance(used, int) else None))
        return out

    def _fig_gpm(self, nv: ModuleType, h: Handle) -> dict[str, float]:
        index = next(i for i, known in self._handles.items() if known is h)
        if not self._call(nv.nvmlGpmQueryDeviceSupport, h).isSupportedDevice:
            raise NvmlError("GPM not supported on this card")
        sample = self._call(nv.nvmlGpmSampleGet, h, self._call(nv.nvmlGpmSampleAlloc))
        previous = self._gpm.get(index)
        self._gpm[index] = sample
        if previous is None:
            return {}  # two samples make a figure: the next call has one
        ids = {
            "sm_active": nv.NVML_GPM_METRIC_SM_UTIL,
            "sm_occupancy": nv.NVML_GPM_METRIC_SM_OCCUPANCY,
            "tensor_active": nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
            "dram_active": nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
        }
        ask = nv.c_nvmlGpmMetricsGet_t()
        ask.version = nv.NVML_GPM_METRICS_GET_VERSION
        ask.numMetrics = len(ids)
        ask.sample1, ask.sample2 = previous, sample
        for n, metric in enumerate(ids.values()):
            ask.metrics[n].metricId = metric
        try:
            got = self._call(nv.nvmlGpmMetricsGet, ask)
        finally:
            self._call(nv.nvmlGpmSampleFree, previous)
        return {
            key: float(got.metrics[n].value) / 100
            for n, key in enumerate(ids)
            if got.metrics[n].nvmlReturn == nv.NVML_SUCCESS
        }

    def _fig_mig_mode(self, nv: ModuleType, h: Handle) -> bool:
        current, _pending = self._call(nv.nvmlDeviceGetMigMode, h)
        return bool(current == nv.NVML_DEVICE_MIG_ENABLE)

    def _fig_mig_instances(self, nv: ModuleType, h: Handle) -> list[MigFigure]:
        out: list[MigFigure] = []
        for slot in range(int(self._call(nv.nvmlDeviceGetMaxMigDeviceCount, h))):
            try:
                mig = self._call(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, slot)
            except NvmlError:
                continue  # an empty slot
            memory = self._call(nv.nvmlDeviceGetMemoryInfo, mig)
            gi_id = int(self._call(nv.nvmlDeviceGetGpuInstanceId, mig))
            profile: str | None = None
            try:
                gi = self._call(nv.nvmlDeviceGetGpuInstanceById, h, gi_id)
                info = self._call(nv.nvmlGpuInstanceGetInfo, gi)
                about = self._call(nv.nvmlDeviceGetGpuInstanceProfileInfoById, h, info.profileId)
                profile = _text(about.name).removeprefix("MIG ").strip() or None
            except NvmlError:
                pass  # the instance is still usable without its profile's name
            out.append(
                {
                    "uuid": _text(self._call(nv.nvmlDeviceGetUUID, mig)),
                    "memory_total": int(memory.total),
                    "memory_used": int(memory.used),
                    "gi_id": gi_id,
                    "ci_id": int(self._call(nv.nvmlDeviceGetComputeInstanceId, mig)),
                    "profile": profile,
                }
            )
        return out

    def _fig_persistence_mode(self, nv: ModuleType, h: Handle) -> bool:
        return bool(self._call(nv.nvmlDeviceGetPersistenceMode, h) == nv.NVML_FEATURE_ENABLED)

    def _fig_ecc_mode(self, nv: ModuleType, h: Handle) -> bool:
        current, _pending = self._call(nv.nvmlDeviceGetEccMode, h)
        return bool(current == nv.NVML_FEATURE_ENABLED)

    def _ecc(self, nv: ModuleType, h: Handle, uncorrected: bool, aggregate: bool) -> int:
        kind = (
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            if uncorrected
            else nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        )
        counter = nv.NVML_AGGREGATE_ECC if aggregate else nv.NVML_VOLATILE_ECC
        return int(self._call(nv.nvmlDeviceGetTotalEccErrors, h, kind, counter))

    def _fig_ecc_volatile_corrected(self, nv: ModuleType, h: Handle) -> int:
        return self._ecc(nv, h, False, False)

    def _fig_ecc_volatile_uncorrected(self, nv: ModuleType, h: Handle) -> int:
        return self._ecc(nv, h, True, False)

    def _fig_ecc_aggregate_corrected(self, nv: ModuleType, h: Handle) -> int:
        return self._ecc(nv, h, False, True)

    def _fig_ecc_aggregate_uncorrected(self, nv: ModuleType, h: Handle) -> int:
        return self._ecc(nv, h, True, True)

    def _fig_retired_pages(self, nv: ModuleType, h: Handle) -> int:
        causes = (
            nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        return sum(len(self._call(nv.nvmlDeviceGetRetiredPages, h, c)) for c in causes)

    def _fig_retired_pending(self, nv: ModuleType, h: Handle) -> bool:
        return bool(self._call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h))

    def _fig_remapped_rows(self, nv: ModuleType, h: Handle) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failed = self._call(nv.nvmlDeviceGetRemappedRows, h)
        return int(corr), int(unc), bool(pending), bool(failed)

    def _fig_nvlink(self, nv: ModuleType, h: Handle) -> list[tuple[bool, dict[str, int]]]:
        links: list[tuple[bool, dict[str, int]]] = []
        for link in range(_NVLINK_MAX_LINKS):
            try:
                active = self._call(nv.nvmlDeviceGetNvLinkState, h, link)
            except NvmlError:
                continue  # the card has no such link
            counts: dict[str, int] = {}
            for number, counter in enumerate(NVLINK_COUNTERS):
                try:
                    counts[counter] = int(
                        self._call(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, number)
                    )
                except NvmlError:
                    pass
            links.append((bool(active == nv.NVML_FEATURE_ENABLED), counts))
        if not links:
            raise NvmlError("no NVLink on this card")
        return links

    def _fig_fabric(self, nv: ModuleType, h: Handle) -> FabricFigure:
        # The versioned call (v3 has the health summary, v2 the health mask) where the
        # driver and nvidia-ml-py have it, else the first one (535 on).
        info = None
        for kind in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
            struct = getattr(nv, kind, None)
            if struct is None or not hasattr(nv, "nvmlDeviceGetGpuFabricInfoV"):
                continue
            try:
                info = struct()
                self._call(nv.nvmlDeviceGetGpuFabricInfoV, h, byref(info))
                break
            except NvmlError:
                info = None  # a version this driver does not take: try the older one
        if info is None:
            info = nv.c_nvmlGpuFabricInfo_t()
            self._call(nv.nvmlDeviceGetGpuFabricInfo, h, byref(info))
        status = int(info.status)
        found: FabricFigure = {
            "state": int(info.state),
            "status": "Success" if status == 0 else _text(nv.nvmlErrorString(status)),
            "cluster_uuid": fabric_uuid(bytes(info.clusterUuid)),
            "clique_id": int(info.cliqueId),
        }
        if hasattr(info, "healthMask"):
            found["health_mask"] = int(info.healthMask)
        if hasattr(info, "healthSummary"):
            found["health_summary"] = int(info.healthSummary)
        return found

    def xid_events(self) -> list[tuple[int, int]]:
        nv = self._started()
        if self._events is None:
            events = self._call(nv.nvmlEventSetCreate)
            for index in range(self.device_count()):
                try:
                    self._call(
                        nv.nvmlDeviceRegisterEvents, self._handle(index), _XID_CRITICAL, events
                    )
                except NvmlError:
                    pass  # a card that cannot report them (a MIG parent, an old board)
            self._events = events
        found: list[tuple[int, int]] = []
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                return found  # a timeout: nothing more waiting
            index = next((i for i, h in self._handles.items() if h == data.device), -1)
            found.append((index, int(data.eventData)))


def fabric_uuid(raw: bytes) -> str:
    """A fabric's 16-byte ClusterUUID as nvidia-smi writes it, '00000001-0000-...'."""
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:32]}"


def process_group(pid: int) -> int | None:
    """The process group of ``pid``; None when it is gone or not ours to see."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None
