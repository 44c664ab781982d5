"""DCGM profiling counters per card from dcgm-exporter's ``/metrics`` page.

``parse_dcgm_exporter`` is pure (Prometheus text exposition in, ``ProfCounters`` out);
``scrape_dcgm_exporter`` fetches the page. dcgm-exporter writes one line per card and
field, its labels in this order: ``gpu`` (index), ``UUID`` (``uuid`` with its old
namespace flag), ``pci_bus_id`` (newer releases), ``device``, ``modelName``, then
``GPU_I_PROFILE`` and ``GPU_I_ID`` for a MIG instance, ``Hostname``, and any
Kubernetes or attribute labels (``pod``, ``DCGM_FI_DRIVER_VERSION``, ...). The contract:

- Cards are keyed by ``UUID``, or "index:<gpu>" where a line has no UUID; a MIG
  instance, which dcgm-exporter labels with its parent's UUID, is "<key>/<GPU_I_ID>".
- The four counters are ratios of time (0..1). A card whose line is missing, NaN, or
  outside 0..1 (DCGM's "blank" sentinels such as 9223372036854775794 or
  140737488355328 where a field is unsupported) has None there, never 0. A card is
  listed when at least one of the four metrics has a line for it.
- Lines that do not parse are skipped, not raised on: the page is another program's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import aiohttp

MAX_BODY = 4 << 20  # a 16-card node with every field is well under 1 MiB

_FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_SLACK = 1e-3  # ratios a rounding step past 1 are 1


@dataclass(frozen=True)
class ProfCounters:
    """One card's (or MIG instance's) DCGM profiling ratios, 0..1; None where not read.

    ``sm_active``: time at least one warp was resident on an SM, averaged over SMs.
    ``sm_occupancy``: resident warps over the SMs' maximum. ``tensor_active``: time
    the tensor pipes were busy. ``dram_active``: time device memory was moving data.
    """

    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None


def _labels(line: str, at: int) -> tuple[dict[str, str], int] | None:
    """The label set opening at ``line[at] == "{"`` and the index after its "}"."""
    labels: dict[str, str] = {}
    i = at + 1
    while True:
        while i < len(line) and line[i] in " \t,":
            i += 1
        if i < len(line) and line[i] == "}":
            return labels, i + 1
        m = _LABEL_NAME.match(line, i)
        if not m:
            return None
        i = m.end()
        value: list[str] = []
        while True:
            if i >= len(line):
                return None
            c = line[i]
            if c == '"':
                break
            if c == "\\" and i + 1 < len(line):
                nxt = line[i + 1]
                value.append(_ESCAPES.get(nxt, "\\" + nxt))
                i += 2
                continue
            value.append(c)
            i += 1
        labels[m.group(1)] = "".join(value)
        i += 1
        while i < len(line) and line[i] in " \t":
            i += 1
        if i < len(line) and line[i] not in ",}":
            return None


def _ratio(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    if math.isnan(value) or not -_SLACK <= value <= 1 + _SLACK:
        return None
    return min(1.0, max(0.0, value))


def _key(labels: dict[str, str]) -> str | None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if uuid:
        key = uuid
    elif labels.get("gpu"):
        key = f"index:{labels['gpu']}"
    else:
        return None
    instance = labels.get("GPU_I_ID")
    return f"{key}/{instance}" if instance else key


def parse_dcgm_exporter(text: str) -> dict[str, ProfCounters]:
    """Profiling counters by card UUID (MIG: "<UUID>/<GPU_I_ID>") from a /metrics page."""
    found: dict[str, ProfCounters] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("DCGM_FI_PROF_"):  # comments, HELP/TYPE and other fields
            continue
        m = _NAME.match(line)
        field = _FIELDS.get(m.group(0)) if m else None
        if m is None or field is None:
            continue
        at = m.end()
        while line[at : at + 1] in (" ", "\t"):
            at += 1
        labels: dict[str, str] = {}
        if line[at : at + 1] == "{":
            parsed = _labels(line, at)
            if parsed is None:
                continue
            labels, at = parsed
        rest = line[at:].split()
        key = _key(labels)
        if not rest or key is None:
            continue
        counters = found.get(key, ProfCounters())
        if getattr(counters, field) is None:  # a card listed twice (per pod): the first
            found[key] = replace(counters, **{field: _ratio(rest[0])})
    return found


async def scrape_dcgm_exporter(url: str, timeout: float = 2.0) -> dict[str, ProfCounters] | None:
    """GET ``url`` (e.g. http://127.0.0.1:9400/metrics) and parse it; None when unread.

    None, never an exception, on a refused or dropped connection, a bad URL, a timeout
    (``timeout`` seconds for the whole exchange), a status other than 200, or a body
    over ``MAX_BODY`` bytes after decompression.
    """
    body = bytearray()
    try:
        client_timeout = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(timeout=client_timeout) as session:
            async with session.get(url, headers={"Accept": "text/plain"}) as response:
                if response.status != 200:
                    return None
                if (response.content_length or 0) > MAX_BODY:
                    return None
                async for chunk in response.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_BODY:
                        return None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
    return parse_dcgm_exporter(body.decode("utf-8", errors="replace"))
