"""This control plane's seat among the others: its name, where it answers (the admin
API, the agents' port, the control planes' link) and the certificate it shows on that
link, made from its settings and data dir; and its client on the link."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from llmgw import pki
from llmgw.config import ServerConfig, format_hostport
from llmgw.server.datadir import DataDir
from llmgw.server.ha.peerlink import PeerClient


@dataclass(frozen=True)
class Seat:
    """This control plane: its name and where it answers."""

    name: str
    api_address: str
    agent_address: str
    peer_address: str
    # Its certificate on the control planes' link.
    cert_serial: str


def seat_of(
    config: ServerConfig, data: DataDir, api_addresses: list[str], agent_addresses: list[str]
) -> Seat:
    """The seat ``config`` gives, its peer certificate made first if it has none (named
    for the host and every address it advertises)."""
    name = config.ha.name or socket.gethostname()
    first = config.advertise[0] if config.advertise else "127.0.0.1"
    sans = [*config.advertise, socket.gethostname(), "localhost", "127.0.0.1", "::1"]
    serial = data.ensure_peer_cert(name, sans)
    return Seat(
        name,
        api_addresses[0] if api_addresses else format_hostport(first, 8080),
        agent_addresses[0] if agent_addresses else format_hostport(first, config.agent_port),
        format_hostport(first, config.ha.peer_port),
        str(serial),
    )


def peer_client(data: DataDir) -> PeerClient:
    """This control plane's client on the link, with its peer certificate."""
    return PeerClient(pki.peer_tls(data.peer_cert, data.peer_key, data.ca_cert, server=False))
