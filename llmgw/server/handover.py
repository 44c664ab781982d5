"""The control plane's HTTP listening sockets handed to the program that starts again in
its place (an upgrade, ``llmgw restart``), so no client is refused while it does.

A listener binds its own sockets (``bind``) and serves them through aiohttp. When the
control plane stops to start again, each listener first hands over a duplicate of its
sockets (``Listener.hand_over``): closing aiohttp's server then stops the accepting but
leaves the socket listening, so a client that connects meanwhile waits in the kernel's
backlog; requests in flight are finished by aiohttp's graceful shutdown. The
duplicates stay open across ``exec`` (``llmgw.reexec.exec_again`` with ``keep_fds``),
named to the new program by the environment variable ``LLMGW_LISTEN_FDS``
(``{"ADDRESS": [FD, ...]}``, JSON), which takes them (``inherited``) instead of binding.

The agents' port and the control planes' link are closed and bound again: their clients
reconnect by themselves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from dataclasses import dataclass, field

log = logging.getLogger("llmgw.server")

ENV = "LLMGW_LISTEN_FDS"
BACKLOG = 1024


@dataclass(frozen=True)
class Handover:
    """What a control plane that stops to start again keeps open for its next program:
    each listen address's sockets (their descriptors)."""

    fds: dict[str, list[int]] = field(default_factory=dict)

    @property
    def keep_fds(self) -> list[int]:
        return [fd for fds in self.fds.values() for fd in fds]

    def env(self) -> dict[str, str]:
        return {ENV: json.dumps(self.fds, sort_keys=True)}


def bind(address: tuple[str, int], backlog: int = BACKLOG) -> list[socket.socket]:
    """Listening sockets for ``(host, port)``, as asyncio's ``create_server`` binds them:
    one per address the host resolves to, reusing the address, IPv6 ones IPv6 only."""
    host, port = address
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def duplicate(sockets: list[socket.socket]) -> list[int]:
    """Descriptors of ``sockets`` that outlive their closing (and an ``exec``)."""
    fds = [os.dup(s.fileno()) for s in sockets]
    for fd in fds:
        os.set_inheritable(fd, True)
    return fds


def inherited() -> dict[str, list[socket.socket]]:
    """The listening sockets the program before this one handed over, by listen address;
    taken once (the variable is cleared, so a child never sees it)."""
    raw = os.environ.pop(ENV, "")
    if not raw:
        return {}
    try:
        named = json.loads(raw)
    except ValueError:
        log.warning("%s is not JSON; binding the listeners anew", ENV)
        return {}
    out: dict[str, list[socket.socket]] = {}
    if not isinstance(named, dict):
        return out
    for address, fds in named.items():
        if not isinstance(fds, list):
            continue
        socks = []
        for fd in fds:
            if not isinstance(fd, int):
                continue
            try:
                sock = socket.socket(fileno=fd)
            except OSError as exc:
                log.warning(
                    "the listening socket %d handed over for %s is gone: %s", fd, address, exc
                )
                continue
            sock.set_inheritable(False)
            sock.setblocking(False)
            socks.append(sock)
        if socks:
            out[str(address)] = socks
    return out


def close_unused(sockets: dict[str, list[socket.socket]]) -> None:
    """Sockets handed over for an address this control plane no longer listens on."""
    for address, socks in sockets.items():
        log.info("no longer listening on %s (handed over, not in server.yaml)", address)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
