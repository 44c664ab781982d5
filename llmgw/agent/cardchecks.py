"""The cards' lines of ``llmgw doctor``: driver and CUDA, and per card its PCIe link,
ECC, throttling, persistence mode and MIG, then the Xids in the kernel log.

``card_checks`` is pure: it judges what discovery read (the cards' figures, their slow
figures and the health warnings made from them) and says each fault with its fix, the
same words the control plane shows. A figure not read is said to be not read, never
taken as fine.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.agent.discovery.nvidia_smi import MIG_UNLISTED
from llmgw.agent.doctor import Check
from llmgw.wire.hardware import GPU, GpuHealth
from llmgw.wire.warnings import split_fix

PERSISTENCE_FIX = (
    "turn persistence mode on (`nvidia-smi -pm 1`, or run nvidia-persistenced): without it "
    "the driver unloads between uses and each start of an engine or of NVML waits seconds"
)


def _versions(gpus: Sequence[GPU], cuda: str | None) -> Check:
    drivers = sorted({g.driver for g in gpus if g.driver})
    if not drivers:
        return Check(
            "driver",
            "warn",
            "the driver's version was not read",
            "run `nvidia-smi` by hand and read its first lines",
        )
    detail = f"driver {', '.join(drivers)}; CUDA {cuda or 'version not read'}"
    return Check("driver", "ok", detail)


def _link(gpu: GPU) -> str:
    if gpu.pcie_gen is None or gpu.pcie_width is None:
        return "PCIe link not read"
    link = f"PCIe Gen{gpu.pcie_gen} x{gpu.pcie_width}"
    if gpu.pcie_gen_max is not None and gpu.pcie_width_max is not None:
        link += f" of Gen{gpu.pcie_gen_max} x{gpu.pcie_width_max}"
    card, host = gpu.pcie_gen_device_max, gpu.pcie_gen_host_max
    if card is not None and host is not None and host < card:
        link += f" (the card can run Gen{card}, its slot Gen{host})"
    return link


def _ecc(h: GpuHealth | None) -> str:
    if h is None or h.ecc_mode is None:
        return "ECC not read"
    if not h.ecc_mode:
        return "ECC off"
    counts = [
        f"{n} {what}"
        for n, what in (
            (h.ecc_volatile_corrected, "corrected"),
            (h.ecc_volatile_uncorrected, "uncorrected"),
        )
        if n is not None
    ]
    return f"ECC on ({', '.join(counts)} since the driver loaded)" if counts else "ECC on"


def _mig(gpu: GPU, instances: Sequence[GPU], unlisted: bool) -> str | None:
    if instances:
        profiles = ", ".join(i.mig_profile or "?" for i in instances)
        return f"MIG on, {len(instances)} instance(s): {profiles}"
    if gpu.mig_mode:
        return "MIG on, its instances not read" if unlisted else "MIG on, no instance carved"
    return None


def _card_check(
    gpu: GPU, instances: Sequence[GPU], h: GpuHealth | None, warnings: Sequence[str]
) -> Check:
    parts = [_link(gpu), _ecc(h)]
    if gpu.throttle is not None:
        parts.append("throttled: " + ", ".join(gpu.throttle) if gpu.throttle else "not throttled")
    if h is not None and h.persistence_mode is not None:
        parts.append(f"persistence mode {'on' if h.persistence_mode else 'off'}")
    # `nvidia-smi -L` failed: what a MIG-mode card holds is not known, not nothing.
    unlisted = [w for w in warnings if w.startswith(MIG_UNLISTED)]
    if mig := _mig(gpu, instances, bool(unlisted)):
        parts.append(mig)
    name = f"card {gpu.index}"
    mine = [w for w in warnings if f"card {gpu.index} (" in w and not w.startswith("xid:")]
    if gpu.mig_mode and not instances and unlisted:
        mine += unlisted
    elif gpu.mig_mode and not instances:
        mine.append(
            "mig: no MIG instance is carved, so no replica can be placed on it. Fix: carve "
            f"instances (`nvidia-smi mig -i {gpu.index} -cgi PROFILES -C`) or turn MIG off "
            f"(`nvidia-smi -i {gpu.index} -mig 0`)"
        )
    detail = f"{gpu.name}: " + "; ".join(parts)
    # Persistence mode off is no warning of discovery's, so its fix joins theirs here
    # (it was dropped whenever the card had another warning).
    persistence = [PERSISTENCE_FIX] if h is not None and h.persistence_mode is False else []
    if mine:
        said, fixes = zip(*(split_fix(w) for w in mine), strict=True)
        fix = " / ".join([*(f for f in fixes if f), *persistence]) or None
        return Check(name, "warn", detail + ". " + "; ".join(said), fix)
    if persistence:
        return Check(name, "warn", detail, PERSISTENCE_FIX)
    return Check(name, "ok", detail)


def _xid_check(warnings: Sequence[str], kernel_log: bool) -> Check:
    xids = [w for w in warnings if w.startswith("xid:")]
    if xids:
        said, fixes = zip(*(split_fix(w) for w in xids), strict=True)
        return Check("xid", "warn", "; ".join(said), " / ".join(f for f in fixes if f))
    if not kernel_log:
        return Check(
            "xid",
            "warn",
            "the kernel log could not be read, so Xids since boot are unknown",
            "run `llmgw doctor` as root (it reads /dev/kmsg), or `sudo dmesg | grep Xid`",
        )
    return Check("xid", "ok", "no Xid in the last hour of the kernel log")


def card_checks(
    gpus: Sequence[GPU],
    health: Sequence[GpuHealth],
    warnings: Sequence[str],
    cuda: str | None,
    kernel_log: bool,
) -> list[Check]:
    """Doctor's lines for the cards; none on a node without NVIDIA cards."""
    if not gpus:
        return []
    by_uuid = {h.uuid: h for h in health}
    cards: dict[str, GPU] = {}
    instances: dict[str, list[GPU]] = {}
    for gpu in gpus:
        if gpu.mig_parent:
            instances.setdefault(gpu.mig_parent, []).append(gpu)
            cards.setdefault(gpu.mig_parent, gpu)
        else:
            cards[gpu.uuid] = gpu
    checks = [_versions(gpus, cuda)]
    for uuid, gpu in cards.items():
        checks.append(_card_check(gpu, instances.get(uuid, []), by_uuid.get(uuid), warnings))
    checks.append(_xid_check(warnings, kernel_log))
    return checks
