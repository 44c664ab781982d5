"""Free TCP ports for the tests' own servers, outside the kernel's ephemeral range.

A port asked of the kernel (bind to 0) comes from ``net.ipv4.ip_local_port_range``
(32768-60999), where every outbound connection of every process on the machine also
takes its local port: between a test choosing one and its server binding it, a client
socket elsewhere may take it ("address already in use"). Ports here come from a block
of this pytest-xdist worker's own below that range (apart from each other worker's, and
from ``cluster.engine_ports``' 22000-24999), in turn, each checked free when handed out.
"""

from __future__ import annotations

import os
import random
import socket

FIRST = 25000
BLOCK = 900  # ports per worker: eight workers fit below 32768


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


_start = FIRST + (_worker() % 8) * BLOCK
_next = random.randrange(BLOCK)


def free_port() -> int:
    """A port no one listens on or is bound to now, on any address."""
    global _next
    for _ in range(BLOCK):
        port = _start + _next % BLOCK
        _next += 1
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_start}-{_start + BLOCK - 1}")
