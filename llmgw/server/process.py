"""``llmgw server run``: a control plane put together (``app.ControlPlane``) and run to a
signal."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from llmgw import __version__, pki
from llmgw.config import parse_hostport
from llmgw.server.app import ControlPlane
from llmgw.server.collector import Collector
from llmgw.server.datadir import DataDir
from llmgw.server.fleet.agentport import AgentPort
from llmgw.server.front import (
    AsgiBridge,
    Listener,
    connection_cap,
    hold_mmap_threshold,
    raise_file_limit,
)
from llmgw.server.ha.peerlink import PeerListener
from llmgw.server.handover import Handover, close_unused, inherited
from llmgw.server.store import open_store

log = logging.getLogger("llmgw.server")


async def serve(cp: ControlPlane) -> Handover | None:
    """Run a control plane to its stop: its agents' and control planes' ports, its
    listeners, its store's and engines' watches, its role. When it stops to start again
    (``cp.relaunch``), its listening sockets are handed over (``handover.py``)."""
    agent_host = parse_hostport(cp.config.listen)[0]
    cp.agent_port = AgentPort(
        cp.registry,
        pki.server_tls(cp.data.server_cert, cp.data.server_key, cp.data.ca_cert),
        agent_host,
        cp.config.agent_port,
        cp.ha.agent_addresses,
        cp.ha.redirect,
        cp.pushed_for,
    )
    await cp.agent_port.start()
    cp.peer_listener = PeerListener(
        cp.ha,
        pki.peer_tls(cp.data.peer_cert, cp.data.peer_key, cp.data.ca_cert, server=True),
        agent_host,
        cp.config.ha.peer_port,
        relaunch=cp.relaunch,
        upgrade=cp.upgrades.service.peer_upgrade,
    )
    await cp.peer_listener.start()
    gw = cp.config.gateway
    bridge = AsgiBridge(cp.admin_app())
    cap = connection_cap(gw.max_connections, raise_file_limit())
    limits: dict[str, Any] = {
        "header_timeout": gw.header_timeout,
        "keepalive_timeout": gw.keepalive_timeout,
    }
    mirror = cp.mirror.handle if cp.mirror is not None else None
    cp.listeners = [
        Listener(cp.config.listen, cp.gateway.handle, bridge, cap=cap, mirror=mirror, **limits)
    ]
    if cp.config.admin_listen:
        # The admin listener serves the admin API and pages, never /v1.
        cp.listeners.append(Listener(cp.config.admin_listen, None, bridge, **limits))
    store = asyncio.create_task(cp.store.watch(cp.stopping))
    probe = asyncio.create_task(cp.gateway.probe_engines(cp.stopping))
    watch = asyncio.create_task(cp.ha.watch(cp.stopping))
    handed = inherited()
    handover: Handover | None = None
    # mirror.api and mirror.peers, asked every 15 s (none named: done at once).
    mirrors = asyncio.create_task(cp.mirror_watch.run(cp.stopping))
    # The cycle collector on the control plane's schedule, what lives as long as the
    # agents' streams kept out of its walks (``llmgw.server.collector``).
    collector = asyncio.create_task(Collector().run(cp.stopping))
    try:
        # The role first: an old leader started again learns here that another leads.
        await cp.ha.start()
        # Engines that ran before this start answer their probe before /v1 opens,
        # so the first requests find them (no 503 until their agents come back).
        await cp.gateway.probe.first_round()
        for listener in cp.listeners:
            await listener.start(handed.pop(listener.address, None))
        close_unused(handed)
        log.info(
            "control plane %s (%s, %s): HTTP on %s, agents on port %d, control planes "
            "on port %d, store %s, at most %d client connections",
            __version__,
            cp.ha.name,
            cp.ha.role,
            cp.config.listen,
            cp.config.agent_port,
            cp.config.ha.peer_port,
            cp.config.store.backend,
            cap,
        )
        await cp.stopping.wait()
    finally:
        cp.stopping.set()
        if cp.relaunch_reason is not None:
            # Kept listening while the requests in flight finish and the program starts
            # again: new clients wait in the backlog, none is refused.
            handover = Handover({x.address: x.hand_over() for x in cp.listeners if x.sockets})
            # Each connection open ends after its answer (`Connection: close`); its client's
            # next one waits in the backlog for the next program.
            await asyncio.gather(*(x.drain() for x in cp.listeners))
        for listener in cp.listeners:
            await listener.stop()
        await watch
        await cp.ha.stop()
        await probe
        await cp.gateway.close()
        await cp.inspector.close()
        await cp.agent_port.stop()
        await cp.peer_listener.stop()
        await mirrors
        await collector
        await cp.restarts.close()
        await store
        # What is queued goes out (within the export timeout), off the event loop.
        await asyncio.to_thread(cp.tracing.shutdown)
    return handover


async def run_server(root: Path) -> Handover | None:
    """Run the control plane of ``root`` to its stop; when it asked to be started again
    in place (``ControlPlane.relaunch``), what the next program takes over."""
    # Before the agents' streams come: their TLS buffers are the most of the heap.
    hold_mmap_threshold()
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    cp = ControlPlane(data, config, store)
    await cp.load()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, cp.stopping.set)
    try:
        handover = await serve(cp)
    finally:
        await store.close()
    return handover if cp.relaunch_reason is not None else None
