"""The words agents, control plane, console and doctor share about the hardware.

A warning reads ``KIND: what happened. Fix: what to do``: ``split_fix`` parts what from
the fix, ``warning_kind`` names the kind (``pcie``, ``xid``, ``nvml``...), by which the
control plane counts them on /metrics. ``THROTTLE_REASONS`` are the clock throttle
reasons by the names every reader gives them (NVML's bits, ``nvidia-smi``'s tags).
"""

from __future__ import annotations

THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clocks",
)


# The kinds of warning an agent's heartbeats carry whole, made by the tools it reads
# apart from the heartbeat (agent/discovery/collector.py): one of these in Register's
# facts is superseded by the heartbeats of an agent that sends figures' ages.
COLLECTED_KINDS = frozenset({"nvidia-smi", "nvml", "disk", "ibstat", "dcgm-exporter"})


def split_fix(warning: str) -> tuple[str, str | None]:
    """(what happened, what to do), the fix None when the warning names none."""
    detail, sep, fix = warning.partition(" Fix: ")
    return (detail.rstrip(". "), fix) if sep else (warning, None)


def warning_kind(text: str) -> str:
    """What a warning is about, by the word it leads with ("pcie: card 3 ..." -> "pcie");
    "other" when it leads with none."""
    head, sep, _ = text.partition(":")
    word = head.strip().lower()
    return word if sep and word and " " not in word and len(word) <= 20 else "other"
