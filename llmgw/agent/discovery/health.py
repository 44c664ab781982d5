"""A node's health warnings from its cards' figures: what is wrong, and its fix.

``card_warnings`` is pure: it judges the cards' latest figures (``GPU``), their slow
figures (``GpuHealth``, with the Xids seen) and the time, and gives one warning per
fault, each ``KIND: what. Fix: what to do`` so the control plane can count them by
kind (``llmgw_node_warnings{kind}``) and ``llmgw doctor`` can show the fix apart.

The rules, and why each is a fault and not noise:

- ``pcie``: fewer lanes than the card and slot allow is a seating, riser or slot fault
  at any load. A slower generation alone is one only while the card is busy: cards drop
  to Gen1 at idle to save power and train up under load.
- ``xid``: an Xid in the last hour, with what the code means and what to do.
- ``ecc``: any uncorrected ECC error (since the driver loaded, or over the card's life).
- ``remap``: a row remap that failed (the card is out of spare rows), or a remap or page
  retirement waiting for a reset.
- ``throttle``: clocks held down by heat or by the board's power brake or a hardware
  slowdown. Power capping (``sw_power_cap``) is a card working at its limit, not a fault.
- ``nvlink``: links of the card that are down.
A figure not read never makes a warning.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.agent.discovery.pcilink import PciLink, link_warning
from llmgw.agent.discovery.xid import xid_meaning
from llmgw.wire.hardware import GPU, GpuHealth

XID_WINDOW = 3600.0
BUSY_FOR_SPEED = 50  # percent: above it a slow link is not power saving
THROTTLE_FAULTS = {
    "hw_slowdown": "a hardware slowdown (the board's own protection)",
    "hw_thermal_slowdown": "heat (hardware thermal slowdown)",
    "sw_thermal_slowdown": "heat (the driver's thermal slowdown)",
    "hw_power_brake_slowdown": "the power brake (the system's power supply asked for it)",
}
_THROTTLE_FIX = (
    "check the card's airflow and the room's cooling (`nvidia-smi -q -d TEMPERATURE,"
    "PERFORMANCE`); a power brake points at the node's power supply"
)
_ECC_FIX = (
    "drain the node (`llmgw ctl node drain NODE`), reset the card (`nvidia-smi -r -i {i}`) "
    "or reboot; if uncorrected errors come back, take the card out of service"
)


def _card(gpu: GPU) -> str:
    return f"card {gpu.index} ({gpu.name})"


def _pcie(gpu: GPU) -> str | None:
    width, width_max = gpu.pcie_width, gpu.pcie_width_max
    gen, gen_max = gpu.pcie_gen, gpu.pcie_gen_max
    if width is None or width_max is None or gen is None or gen_max is None:
        return None
    narrow = width < width_max
    slow = gen < gen_max and (gpu.utilization or 0) >= BUSY_FOR_SPEED
    if not (narrow or slow):
        return None
    link = PciLink(
        speed_cap_gts=None,
        width_cap=gpu.pcie_width_max,
        speed_sta_gts=None,
        width_sta=gpu.pcie_width,
        gen_cap=gpu.pcie_gen_max,
        gen_sta=gpu.pcie_gen,
        degraded=True,
        downgraded_words=None,
    )
    said = link_warning(_card(gpu), link)
    bus = gpu.bus_id or "BUS"
    return (
        f"pcie: {said}. Fix: reseat it or check the slot and riser: "
        f"`lspci -vv -s {bus}` LnkCap/LnkSta"
    )


def _throttle(gpu: GPU) -> str | None:
    faults = [THROTTLE_FAULTS[r] for r in gpu.throttle or () if r in THROTTLE_FAULTS]
    if not faults:
        return None
    return f"throttle: {_card(gpu)} is held down by {', '.join(faults)}. Fix: {_THROTTLE_FIX}"


def _ecc(gpu: GPU, h: GpuHealth) -> list[str]:
    out: list[str] = []
    volatile, aggregate = h.ecc_volatile_uncorrected, h.ecc_aggregate_uncorrected
    if volatile or aggregate:
        counts = []
        if volatile:
            counts.append(f"{volatile} since the driver loaded")
        if aggregate:
            counts.append(f"{aggregate} over its life")
        out.append(
            f"ecc: {_card(gpu)} has uncorrected ECC errors ({', '.join(counts)}). "
            f"Fix: {_ECC_FIX.format(i=gpu.index)}"
        )
    if h.remap_failed:
        out.append(
            f"remap: {_card(gpu)} could not remap a failing memory row: it has no spare "
            "rows left. Fix: take the card out of service and ask the vendor"
        )
    elif h.remap_pending or h.retired_pending:
        what = "a memory row remap" if h.remap_pending else "a page retirement"
        out.append(
            f"remap: {_card(gpu)} has {what} waiting for a reset. Fix: drain the node, then "
            f"reset the card (`nvidia-smi -r -i {gpu.index}`) or reboot"
        )
    return out


def _xids(gpu: GPU, h: GpuHealth, now: float) -> list[str]:
    out: list[str] = []
    for seen in h.xids or ():
        if now - seen.last > XID_WINDOW:
            continue
        meaning, fix = xid_meaning(seen.code)
        minutes = max(0, int((now - seen.last) // 60))
        times = f"{seen.count} times, last" if seen.count > 1 else "once,"
        out.append(
            f"xid: {_card(gpu)} reported Xid {seen.code} ({times} {minutes} min ago): "
            f"{meaning}. Fix: {fix}"
        )
    return out


def _nvlink(gpu: GPU, h: GpuHealth) -> str | None:
    if h.nvlink_links is None or h.nvlink_active is None or h.nvlink_active >= h.nvlink_links:
        return None
    down = h.nvlink_links - h.nvlink_active
    return (
        f"nvlink: {_card(gpu)} has {down} of {h.nvlink_links} NVLink links down. Fix: "
        f"`nvidia-smi nvlink -s -i {gpu.index}`; reset the card, and check the NVSwitch or bridge"
    )


def card_warnings(gpus: Sequence[GPU], health: Sequence[GpuHealth], now: float) -> list[str]:
    """Every health warning of the node's cards, in card order."""
    by_uuid = {h.uuid: h for h in health}
    out: list[str] = []
    seen_parents: set[str] = set()
    for gpu in gpus:
        # A MIG instance shares its card's link and sensors: judge the card once.
        key = gpu.mig_parent or gpu.uuid
        if key in seen_parents:
            continue
        seen_parents.add(key)
        for said in (_pcie(gpu), _throttle(gpu)):
            if said:
                out.append(said)
        h = by_uuid.get(key)
        if h is not None:
            out += _ecc(gpu, h)
            out += _xids(gpu, h, now)
            if said := _nvlink(gpu, h):
                out.append(said)
    return out
