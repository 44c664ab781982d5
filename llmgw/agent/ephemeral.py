"""The ports the kernel hands out on its own (ephemeral ports), where they fall in the
engine port range llmgw's table guards.

A replica spanning nodes on vLLM or SGLang talks between its nodes over NCCL and
torch.distributed's gloo, and both listen on ports the kernel picks (bind to port 0):
NCCL's bootstrap and socket transport on every rank, gloo's pairs, and vLLM's own
message queues on the leader when ``VLLM_PORT`` is unset. NCCL has no setting that
pins them (NVIDIA/nccl#388: "Specifying the client port ... is not [possible] at the
moment"). Linux picks them from ``net.ipv4.ip_local_port_range`` (32768-60999 by
default) less ``net.ipv4.ip_local_reserved_ports``, so with the default engine range
41000-41999 any of them may land on a port llmgw's table answers with a reset, and the
replica fails to form now and then. The member nodes of such a replica are therefore
let in to the part of the engine range the kernel may hand out; a node whose admin
reserved the engine range (``sysctl net.ipv4.ip_local_reserved_ports=41000-41999``)
needs no such rule, and gets none.

``overlap`` is pure; ``read_ephemeral`` reads the two sysctls.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc/sys/net/ipv4")
Ports = tuple[int, int]


def parse_local_range(text: str) -> Ports | None:
    """``ip_local_port_range`` ("32768\\t60999"); None for text that is not two ports."""
    words = text.split()
    if len(words) != 2 or not all(w.isdigit() for w in words):
        return None
    lo, hi = int(words[0]), int(words[1])
    return (lo, hi) if 1 <= lo <= hi <= 65535 else None


def parse_reserved(text: str) -> list[Ports]:
    """``ip_local_reserved_ports`` ("41000-41999,8080", or empty); parts that are not
    ports or ranges are left out."""
    found: list[Ports] = []
    for part in text.strip().split(","):
        lo, _, hi = part.strip().partition("-")
        hi = hi or lo
        if lo.isdigit() and hi.isdigit() and int(lo) <= int(hi):
            found.append((int(lo), int(hi)))
    return found


def overlap(engine: Ports, local: Ports | None, reserved: list[Ports]) -> list[Ports]:
    """The ranges of ``engine`` the kernel may hand out as ephemeral ports: inside
    ``local`` and not ``reserved``. The whole engine range when ``local`` is not
    known (any port could be picked)."""
    lo, hi = engine
    if local is not None:
        lo, hi = max(lo, local[0]), min(hi, local[1])
    out: list[Ports] = []
    start = lo
    for r_lo, r_hi in sorted(reserved):
        if r_hi < start or r_lo > hi:
            continue
        if r_lo > start:
            out.append((start, r_lo - 1))
        start = max(start, r_hi + 1)
    if start <= hi:
        out.append((start, hi))
    return out


def read_ephemeral(proc: Path = PROC) -> tuple[Ports | None, list[Ports]]:
    """The kernel's ephemeral range and its reserved ports; (None, []) where unread."""
    try:
        local = parse_local_range((proc / "ip_local_port_range").read_text())
    except OSError:
        local = None
    try:
        reserved = parse_reserved((proc / "ip_local_reserved_ports").read_text())
    except OSError:
        reserved = []
    return local, reserved
