"""Cards into wire records: NVML's answers, or ``nvidia-smi -q -x``'s, as ``GPU`` (the
figures that move, every heartbeat) and ``GpuHealth`` (the slow ones, every minute:
ECC, rows, NVLink, and the card's place in a multi-node NVLink fabric).

Every figure is asked for apart and one that does not come is absent: a driver that
cannot give a card's fan speed still gives its temperature. A card in MIG mode is
reported as its instances, each a card of its own with its parent's UUID and a class
such as ``a100-80g-mig-3g.40gb``; a card in MIG mode with no instance carved is
reported as itself with ``mig_mode`` set, which placement reads as "not usable".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypedDict, TypeVar, cast

from llmgw.agent.discovery.mig import MigInstance
from llmgw.agent.discovery.nvml import FABRIC_STATES, NvmlError, NvmlSource, decode_throttle
from llmgw.agent.discovery.smixml import CardHealth, SmiXml
from llmgw.wire.hardware import CARD_WIDE_FIGURES, GPU, GpuHealth, GpuProcess

_T = TypeVar("_T")

LOST_CARD_FIX = (
    "look for Xid errors in `dmesg`; a card that fell off the bus needs a reset or a reboot"
)


def _maybe(call: Callable[..., _T], *args: object) -> _T | None:
    try:
        return call(*args)
    except NvmlError:
        return None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _processes(found: object) -> list[GpuProcess] | None:
    if not isinstance(found, list):
        return None
    return [GpuProcess(pid=int(pid), memory=_int(used)) for pid, used in found]


def _pstate(value: object) -> str | None:
    number = _int(value)
    return f"P{number}" if number is not None and 0 <= number <= 15 else None


def _card_nvml(source: NvmlSource, i: int, driver: str | None) -> GPU:
    def fig(name: str) -> object:
        return _maybe(source.figure, i, name)

    memory = _maybe(source.memory, i)
    cc = _maybe(source.compute_capability, i)
    throttle = _int(fig("throttle"))
    found_gpm = fig("gpm")
    gpm: Mapping[str, object] = found_gpm if isinstance(found_gpm, dict) else {}
    return GPU(
        index=i,
        uuid=source.uuid(i),
        name=source.name(i),
        memory_total=memory[0] if memory else None,
        memory_used=memory[1] if memory else None,
        utilization=_maybe(source.utilization, i),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        driver=driver,
        bus_id=_str(fig("bus_id")),
        memory_utilization=_int(fig("memory_utilization")),
        temperature=_int(fig("temperature")),
        memory_temperature=_int(fig("memory_temperature")),
        power=_float(fig("power")),
        power_limit=_float(fig("power_limit")),
        energy=_float(fig("energy")),
        sm_clock=_int(fig("sm_clock")),
        memory_clock=_int(fig("memory_clock")),
        fan=_int(fig("fan")),
        pstate=_pstate(fig("pstate")),
        throttle=decode_throttle(throttle) if throttle is not None else None,
        pcie_gen=_int(fig("pcie_gen")),
        pcie_width=_int(fig("pcie_width")),
        pcie_gen_max=_int(fig("pcie_gen_max")),
        pcie_width_max=_int(fig("pcie_width_max")),
        pcie_gen_device_max=_int(fig("pcie_gen_device_max")),
        sm_active=_float(gpm.get("sm_active")),
        sm_occupancy=_float(gpm.get("sm_occupancy")),
        tensor_active=_float(gpm.get("tensor_active")),
        dram_active=_float(gpm.get("dram_active")),
        processes=_processes(fig("processes")),
        mig_mode=_bool(fig("mig_mode")),
    )


class CardWide(TypedDict):
    """``GPU``'s fields named in ``CARD_WIDE_FIGURES`` (a test keeps the two alike)."""

    bus_id: str | None
    temperature: int | None
    memory_temperature: int | None
    power: float | None
    power_limit: float | None
    energy: float | None
    sm_clock: int | None
    memory_clock: int | None
    fan: int | None
    pstate: str | None
    throttle: list[str] | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    pcie_gen_device_max: int | None
    pcie_gen_host_max: int | None


def card_wide(card: GPU) -> CardWide:
    """The card-wide figures of ``card``, to give its MIG instances."""
    return cast(CardWide, {name: getattr(card, name) for name in CARD_WIDE_FIGURES})


def _instances(card: GPU, found: object) -> list[GPU]:
    """A MIG-mode card as its instances; the card itself when none is carved."""
    if not isinstance(found, list) or not found:
        return [card]
    out: list[GPU] = []
    for inst in found:
        profile = inst.get("profile")
        mig = MigInstance(card.uuid, card.index, None, None, None, profile, None, None)
        out.append(
            GPU(
                index=card.index,
                uuid=str(inst["uuid"]),
                name=card.name,
                memory_total=_int(inst.get("memory_total")),
                memory_used=_int(inst.get("memory_used")),
                compute_capability=card.compute_capability,
                driver=card.driver,
                **card_wide(card),
                mig_mode=True,
                mig_parent=card.uuid,
                mig_profile=profile,
                mig_class=mig.class_name(card.name, card.memory_total),
            )
        )
    return out


def read_nvml(source: NvmlSource) -> tuple[list[GPU], list[str]]:
    """The cards NVML sees, and a warning per card it could not read.

    A figure NVML will not give (MIG mode hides utilisation, some boards hide memory) is
    absent. The count failing raises NvmlError: then NVML as a whole is not answering.
    """
    driver = _maybe(source.driver_version)
    gpus: list[GPU] = []
    warnings: list[str] = []
    for i in range(source.device_count()):
        try:
            card = _card_nvml(source, i, driver)
        except NvmlError as exc:
            warnings.append(f"NVML: card {i} could not be read ({exc}). Fix: {LOST_CARD_FIX}")
            continue
        if card.mig_mode:
            gpus += _instances(card, _maybe(source.figure, i, "mig_instances"))
        else:
            gpus.append(card)
    return gpus, warnings


_TRUE_FALSE = {1: "True", 2: "False"}
# NVML's fabric health mask: (shift, width, the -q -x tag, value -> word). The words are
# nvidia-smi's where a capture shows them ("Full", "False"), ours after them elsewhere.
_FABRIC_HEALTH = (
    (0, 0x3, "bandwidth", {1: "Degraded", 2: "Full"}),
    (2, 0x3, "route_recovery_in_progress", _TRUE_FALSE),
    (4, 0x3, "route_unhealthy", _TRUE_FALSE),
    (6, 0x3, "access_timeout_recovery", _TRUE_FALSE),
    (
        8,
        0xF,
        "incorrect_configuration",
        {
            1: "None",
            2: "Incorrect SYSGUID",
            3: "Incorrect Chassis Serial Number",
            4: "No Partition",
            5: "Insufficient NVLinks",
            6: "Incompatible GPU Firmware",
            7: "Invalid Location",
            8: "GPU State Invalid",
        },
    ),
    (12, 0x3, "partition_assigned", _TRUE_FALSE),
    (14, 0x3, "gfm_state", {1: "Connected", 2: "Disconnected"}),
)
_FABRIC_SUMMARY = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}


def fabric_health(mask: int | None, summary: int | None) -> dict[str, str] | None:
    """NVML's fabric health mask and summary as ``-q -x``'s ``<health>`` entries; those
    NVML says are not supported (0) are left out."""
    found: dict[str, str] = {}
    said = _FABRIC_SUMMARY.get(summary) if summary is not None else None
    if said:
        found["summary"] = said
    for shift, width, tag, words in _FABRIC_HEALTH:
        word = words.get((mask >> shift) & width) if mask is not None else None
        if word:
            found[tag] = word
    return found or None


class _FabricFields(TypedDict, total=False):
    """GpuHealth's fabric fields, as ``_fabric`` reads them from NVML."""

    fabric_state: str
    fabric_status: str | None
    fabric_cluster_uuid: str | None
    fabric_clique_id: int | None
    fabric_health: dict[str, str] | None


def _fabric(found: object) -> _FabricFields:
    """NVML's ``fabric`` figure as GpuHealth's fields; none for a card without a fabric
    (state 0, "not supported"). The status and the ids mean something once Completed."""
    if not isinstance(found, dict):
        return {}
    state = FABRIC_STATES.get(_int(found.get("state")) or 0)
    if state is None:
        return {}
    out: _FabricFields = {"fabric_state": state}
    if state == "Completed":
        out["fabric_status"] = _str(found.get("status"))
        out["fabric_cluster_uuid"] = found.get("cluster_uuid")
        out["fabric_clique_id"] = _int(found.get("clique_id"))
    out["fabric_health"] = fabric_health(
        _int(found.get("health_mask")), _int(found.get("health_summary"))
    )
    return out


def read_nvml_health(source: NvmlSource, count: int) -> list[GpuHealth]:
    """The slow figures of NVML's first ``count`` cards; a card that will not answer is
    left out."""
    out: list[GpuHealth] = []
    for i in range(count):
        try:
            uuid = source.uuid(i)
        except NvmlError:
            continue

        def fig(name: str, i: int = i) -> object:
            return _maybe(source.figure, i, name)

        remap = fig("remapped_rows")
        remap = remap if isinstance(remap, tuple) and len(remap) == 4 else None
        nvlink = fig("nvlink")
        errors: dict[str, int] | None = None
        if isinstance(nvlink, list):
            errors = {}
            for _active, counts in nvlink:
                for counter, n in counts.items():
                    errors[counter] = errors.get(counter, 0) + int(n)
        out.append(
            GpuHealth(
                uuid=uuid,
                index=i,
                persistence_mode=_bool(fig("persistence_mode")),
                ecc_mode=_bool(fig("ecc_mode")),
                ecc_volatile_corrected=_int(fig("ecc_volatile_corrected")),
                ecc_volatile_uncorrected=_int(fig("ecc_volatile_uncorrected")),
                ecc_aggregate_corrected=_int(fig("ecc_aggregate_corrected")),
                ecc_aggregate_uncorrected=_int(fig("ecc_aggregate_uncorrected")),
                retired_pages=_int(fig("retired_pages")),
                retired_pending=_bool(fig("retired_pending")),
                remapped_correctable=remap[0] if remap else None,
                remapped_uncorrectable=remap[1] if remap else None,
                remap_pending=remap[2] if remap else None,
                remap_failed=remap[3] if remap else None,
                nvlink_links=len(nvlink) if isinstance(nvlink, list) else None,
                nvlink_active=sum(1 for a, _ in nvlink if a) if isinstance(nvlink, list) else None,
                nvlink_errors=errors,
                **_fabric(fig("fabric")),
            )
        )
    return out


# --- nvidia-smi -q -x -------------------------------------------------------------------


def _gpu_from_smi(card: CardHealth, driver: str | None) -> GPU:
    return GPU(
        index=card.index,
        uuid=card.uuid or f"index-{card.index}",
        name=card.name or "unknown NVIDIA card",
        memory_total=card.memory_total_bytes,
        memory_used=card.memory_used_bytes,
        utilization=card.utilization_gpu_percent,
        driver=driver,
        bus_id=card.bus_id.lower() if card.bus_id else None,
        memory_utilization=card.utilization_memory_percent,
        temperature=card.temperature_c,
        memory_temperature=card.memory_temperature_c,
        power=card.power_draw_w,
        power_limit=card.power_limit_w,
        energy=card.energy_j,
        sm_clock=card.sm_clock_mhz,
        memory_clock=card.memory_clock_mhz,
        fan=card.fan_percent,
        pstate=card.pstate,
        throttle=list(card.throttle_reasons) if card.throttle_reasons is not None else None,
        pcie_gen=card.pcie_gen_current,
        pcie_width=card.pcie_width_current,
        pcie_gen_max=card.pcie_gen_max,
        pcie_width_max=card.pcie_width_max,
        pcie_gen_device_max=card.pcie_gen_device_max,
        pcie_gen_host_max=card.pcie_gen_host_max,
        processes=[
            GpuProcess(pid=p.pid, name=p.name, memory=p.used_memory_bytes) for p in card.processes
        ],
        mig_mode=None if card.mig_mode_current is None else card.mig_mode_current == "Enabled",
    )


def _health_from_smi(card: CardHealth, uuid: str) -> GpuHealth:
    return GpuHealth(
        uuid=uuid,
        index=card.index,
        persistence_mode=(
            None if card.persistence_mode is None else card.persistence_mode == "Enabled"
        ),
        ecc_mode=None if card.ecc_mode_current is None else card.ecc_mode_current == "Enabled",
        ecc_volatile_corrected=card.ecc_volatile_corrected,
        ecc_volatile_uncorrected=card.ecc_volatile_uncorrected,
        ecc_aggregate_corrected=card.ecc_aggregate_corrected,
        ecc_aggregate_uncorrected=card.ecc_aggregate_uncorrected,
        retired_pages=card.retired_pages_count,
        retired_pending=card.retired_pages_pending,
        remapped_correctable=card.remapped_rows_correctable,
        remapped_uncorrectable=card.remapped_rows_uncorrectable,
        remap_pending=card.remapped_rows_pending,
        remap_failed=card.remapped_rows_failure,
        fabric_state=card.fabric_state,
        fabric_status=card.fabric_status,
        fabric_cluster_uuid=card.fabric_cluster_uuid,
        fabric_clique_id=card.fabric_clique_id,
        fabric_health=card.fabric_health,
    )


def from_smi_xml(
    log: SmiXml, mig: dict[str, list[GPU]] | None = None
) -> tuple[list[GPU], list[GpuHealth]]:
    """``nvidia-smi -q -x``'s cards as wire records; ``mig`` gives each MIG-mode card's
    instances (by the card's UUID) when the caller read them."""
    gpus: list[GPU] = []
    health: list[GpuHealth] = []
    for card in log.cards:
        gpu = _gpu_from_smi(card, log.driver_version)
        instances = (mig or {}).get(gpu.uuid) if gpu.mig_mode else None
        if instances:
            gpus += [replace(i, driver=gpu.driver, **card_wide(gpu)) for i in instances]
        else:
            gpus.append(gpu)
        health.append(_health_from_smi(card, gpu.uuid))
    return gpus, health
