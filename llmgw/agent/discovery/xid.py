"""Xid events: the NVIDIA driver's error reports in the kernel log, and what each means.

``parse_xid_lines`` is pure. It finds the driver's report wherever the line carries it::

    NVRM: Xid (PCI:0000:19:00): 79, pid=4021, name=python3, GPU has fallen off the bus.

behind whatever prefix the log reader added: none, ``dmesg``'s ``[ 1234.567890]``
(seconds since boot) or ``[Sun Feb 23 16:24:18 2025]`` (``-T``), ``dmesg --time-format
iso``'s ``2024-11-15T12:02:03,470068+00:00`` (with ``-x``, after ``kern  :warn  :``),
or journald's and syslog's ``Feb 23 16:24:18 host kernel:``. ``at`` is that time as
printed, wall clock preferred over seconds since boot; None when the line has none.

``pid`` and ``name`` are absent from some Xids (62, 79 on older drivers print hex words
straight after the code) and printed as ``'<unknown>'`` when no process is to blame;
both read as None. Lines that are not Xid reports are ignored.

``XID_MEANINGS`` says, in our words, what the common codes mean and what to do about
them, after NVIDIA's public Xid catalogue; ``xid_meaning`` answers for any code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
    r"(?P<code>\d+)(?:,\s*(?P<rest>.*))?$"
)
_PID = re.compile(r"^pid=(?P<pid>'?<unknown>'?|\d+|[^,]*)(?:,\s*|$)")
_NAME = re.compile(r"^name=(?P<name>.*?)(?:,\s+|$)")
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[,.]\d+)?(?:Z|[+-]\d\d:?\d\d)?")
_SYSLOG = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?")
_BRACKET = re.compile(r"\[\s*(?P<time>[^\]]+?)\s*\]")


@dataclass(frozen=True)
class XidEvent:
    """One Xid report: the card's PCI address (domain:bus:device), the code, who hit it.

    ``text`` is what the driver wrote after the code and the process, as printed.
    """

    pci: str
    code: int
    pid: int | None
    process: str | None
    text: str
    at: str | None


def _when(prefix: str) -> str | None:
    if m := _ISO.search(prefix):
        return m[0]
    if m := _SYSLOG.match(prefix.strip()):
        return m[0]
    if m := _BRACKET.search(prefix):
        return m["time"]
    return None


def _unknown(value: str) -> bool:
    return value.strip("'\" ") in {"", "<unknown>", "unknown"}


def parse_xid_line(line: str) -> XidEvent | None:
    """The Xid report on one log line, or None when the line holds none."""
    m = _XID.search(line.rstrip())
    if m is None:
        return None
    rest = m["rest"] or ""
    pid: int | None = None
    process: str | None = None
    if p := _PID.match(rest):
        pid = int(p["pid"]) if p["pid"].isdigit() else None
        rest = rest[p.end() :]
        if n := _NAME.match(rest):
            process = None if _unknown(n["name"]) else n["name"]
            rest = rest[n.end() :]
    return XidEvent(
        pci=m["pci"].lower(),
        code=int(m["code"]),
        pid=pid,
        process=process,
        text=rest.strip(),
        at=_when(line[: m.start()]),
    )


def parse_xid_lines(text: str) -> list[XidEvent]:
    """Every Xid report in a kernel log, in the order logged; other lines are ignored."""
    events: list[XidEvent] = []
    for line in text.splitlines():
        event = parse_xid_line(line)
        if event is not None:
            events.append(event)
    return events


_RESTART_APP = "restart the application; no action on the card unless it keeps happening"
_RESET = "drain the card, reset it (`nvidia-smi -r`) or reboot the node"
_RMA = "if it comes back after a reset, take the card out of service and ask the vendor"

# code -> (what it means, what to do). Our wording, after NVIDIA's public Xid catalogue.
XID_MEANINGS: dict[int, tuple[str, str]] = {
    8: (
        "the card stopped processing a channel (idle timeout)",
        _RESTART_APP,
    ),
    13: (
        "graphics engine exception: a kernel hit an illegal instruction or an out-of-range address",
        "usually a bug in the application or its CUDA libraries; run it under "
        "compute-sanitizer. If many different programs hit it, suspect the card",
    ),
    31: (
        "GPU memory page fault: a program touched memory it had not mapped",
        "usually a bug in the application (or the framework); "
        + _RESTART_APP
        + ". If unrelated programs fault, suspect the driver",
    ),
    32: (
        "invalid or corrupted push buffer stream reached the card",
        "often PCIe trouble between host and card; check the link (lspci) and the AER "
        "counters; " + _RESET,
    ),
    38: (
        "driver firmware error",
        _RESET + "; update the driver if it repeats",
    ),
    43: (
        "the card stopped a program after it faulted; the card itself is healthy",
        _RESTART_APP,
    ),
    45: (
        "the driver cleaned up a channel after an earlier error or a killed process",
        "look at the Xid logged just before it, which is the cause; on its own, no action",
    ),
    48: (
        "uncorrectable double-bit ECC error in the card's memory",
        "the programs on the card are lost; " + _RESET + "; " + _RMA,
    ),
    61: (
        "internal micro-controller breakpoint or warning",
        _RESET + "; update the driver if it repeats",
    ),
    62: (
        "internal micro-controller halted",
        _RESET + "; " + _RMA,
    ),
    63: (
        "ECC page retirement or row remapping recorded; it takes effect at the next reset",
        "reset the card when it is idle to apply the remap; watch the remap counts",
    ),
    64: (
        "ECC page retirement or row remapping could not be recorded",
        _RESET + "; " + _RMA,
    ),
    68: (
        "video decoder (NVDEC) exception",
        _RESTART_APP,
    ),
    69: (
        "graphics engine class error",
        _RESTART_APP,
    ),
    74: (
        "NVLink error: a link between cards (or to the NVSwitch) saw errors or went down",
        "read `nvidia-smi nvlink -e` and `-s`; " + _RESET + "; if it persists, check the "
        "baseboard, NVSwitch and fabric manager, then ask the vendor",
    ),
    79: (
        "the card has fallen off the bus: the host can no longer reach it over PCIe",
        "reboot the node; check power, cooling, riser and PCIe link; " + _RMA,
    ),
    92: (
        "high rate of corrected single-bit ECC errors",
        "the card still works; watch the ECC counters and plan a reset; " + _RMA,
    ),
    94: (
        "contained uncorrectable ECC error: only the programs using that memory are hit",
        "restart the programs that were stopped; reset the card when idle to remap the row",
    ),
    95: (
        "uncontained uncorrectable ECC error: every program on the card is affected",
        "stop all work on the card; " + _RESET + "; " + _RMA,
    ),
    109: (
        "context switch timeout: a program did not give up the card in time",
        "often the application (a very long kernel); " + _RESTART_APP,
    ),
    119: (
        "GSP timeout: the card's system processor did not answer the driver in time",
        _RESET + "; keep the driver current; " + _RMA,
    ),
    120: (
        "GSP error: the card's system processor reported a fault",
        _RESET + "; keep the driver current; " + _RMA,
    ),
    121: (
        "corrected error on the C2C link between a Grace CPU and its GPU",
        "no action; watch for it turning into uncorrected errors",
    ),
    140: (
        "unrecovered ECC error found while the driver was loading or resetting the card",
        _RESET + "; " + _RMA,
    ),
    154: (
        "the driver says the card needs a recovery action (reset, reboot or power cycle)",
        "do what the driver's message asks: reset the card, reboot, or power-cycle the node",
    ),
}

_UNKNOWN_MEANING = (
    "an Xid this version does not describe: the driver reported an error on the card",
    "look the code up in NVIDIA's Xid catalogue; "
    + _RESTART_APP
    + "; reset the card if it repeats",
)


def xid_meaning(code: int) -> tuple[str, str]:
    """What an Xid code means and what to do: from XID_MEANINGS, or a generic answer."""
    return XID_MEANINGS.get(code, _UNKNOWN_MEANING)
