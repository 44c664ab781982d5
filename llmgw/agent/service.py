"""``llmgw agent run``: enroll once if needed, then keep a stream to a control plane.

The agent moves through the control planes it knows (the leader's list, kept in the
state dir) and reconnects within seconds when one goes; it never needs re-enrolling.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmgw import pki
from llmgw.agent.identity import AgentState, EnrollError, default_node_id, enroll
from llmgw.agent.metricsport import MetricsPort, NodeMetrics
from llmgw.agent.runtime import NodeRuntime, RuntimeOptions
from llmgw.agent.session import (
    FEATURES,
    AgentSession,
    FactSource,
    NodeHooks,
    SessionEnded,
    SessionSettings,
)
from llmgw.config import DiscoveryConfig, TracingConfig, parse_hostport
from llmgw.tracing import start as start_tracing
from llmgw.wire.messages import Message

log = logging.getLogger("llmgw.agent")

RETRY_FIRST = 0.5
RETRY_MAX = 3.0


@dataclass(frozen=True)
class AgentOptions:
    state_dir: Path
    node_id: str | None = None
    server: str | None = None
    token: str | None = None
    data_dirs: tuple[Path, ...] = ()
    heartbeat_interval: float = 5.0
    runtime: RuntimeOptions | None = None
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    # agent.metrics_listen and agent.metrics_scrapers: the node's own metrics.
    metrics_listen: str | None = None
    metrics_scrapers: tuple[str, ...] = ()
    tracing: TracingConfig = field(default_factory=TracingConfig)


async def ensure_enrolled(opts: AgentOptions) -> AgentState:
    state = AgentState.load(opts.state_dir)
    if state.enrolled():
        if opts.node_id and opts.node_id != state.node_id:
            raise EnrollError(
                f"{opts.state_dir} holds node {state.node_id!r}, not {opts.node_id!r}; use "
                "another --state-dir for another node"
            )
        return state
    if not opts.token:
        raise EnrollError(
            f"this node has not joined a cluster ({opts.state_dir} holds no certificate): "
            "run `llmgw node token` on the control plane, then `llmgw agent run --server "
            "HOST:PORT --token TOKEN`"
        )
    node_id = opts.node_id or default_node_id()
    state = await enroll(opts.state_dir, opts.token, node_id, opts.server)
    log.info("enrolled as node %s; certificate kept in %s", node_id, opts.state_dir)
    return state


async def keep_connected(
    state: AgentState,
    source: FactSource,
    settings: SessionSettings,
    stop: asyncio.Event,
    hooks: NodeHooks | None = None,
    sent: Callable[[Message], None] | None = None,
) -> None:
    """Hold a stream to some control plane until ``stop`` is set; ``sent`` is told of
    each message that goes to it."""
    tls = pki.client_tls(state.cert_path, state.key_path, state.ca_path)
    session = AgentSession(state.node_id, tls, source, settings, hooks)
    if sent is not None:
        session.sent = sent
    index = 0
    delay = RETRY_FIRST
    while not stop.is_set():
        planes = state.control_planes
        address = planes[index % len(planes)]
        if session.redirect:
            # A standby named its leader: go there next, whatever the list says.
            address, session.redirect = session.redirect, None
        run = asyncio.create_task(session.run(address))
        halt = asyncio.create_task(stop.wait())
        await asyncio.wait([run, halt], return_when=asyncio.FIRST_COMPLETED)
        halt.cancel()
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            break
        exc = run.exception()
        log.warning("%s", exc)
        if session.control_planes:
            state.learn_control_planes(session.control_planes)
        index += 1
        if session.redirect:
            wait, delay = 0.1, RETRY_FIRST
        elif isinstance(exc, SessionEnded) and exc.registered:
            # A stream that was up just ended: every agent of the cluster saw the same
            # thing at the same moment (a restart, a failover). Spread their first try
            # over the whole retry window, so thousands of handshakes do not land on the
            # control plane in the same half second.
            wait, delay = random.uniform(0.2, RETRY_MAX), RETRY_FIRST
        else:
            wait = delay * (0.5 + random.random() / 2)
            delay = min(delay * 2, RETRY_MAX)
        try:
            await asyncio.wait_for(stop.wait(), timeout=wait)
        except TimeoutError:
            pass


async def run_agent(opts: AgentOptions) -> None:
    from llmgw.agent.discovery import Discovery

    state = await ensure_enrolled(opts)
    runtime_opts = opts.runtime or RuntimeOptions(
        state_dir=opts.state_dir,
        weights_dir=opts.state_dir / "weights",
        release_source="https://github.com/ggml-org/llama.cpp/releases",
    )
    for directory in (opts.state_dir, runtime_opts.weights_dir):
        directory.mkdir(parents=True, exist_ok=True)
    dirs = [opts.state_dir, runtime_opts.weights_dir, *opts.data_dirs]
    found = opts.discovery
    source = Discovery(
        dirs,
        nvidia_smi=found.nvidia_smi,
        slow_interval=found.slow_interval,
        dcgm_exporter=found.dcgm_exporter,
        card_deadline=found.read_deadline,
        collect_interval=opts.heartbeat_interval,
    )
    # Once the node's id is known: its spans say which node they come from.
    tracing = start_tracing(opts.tracing, "llmgw-agent", state.node_id)
    runtime = NodeRuntime(replace(runtime_opts, tracing=tracing))
    source.engine_groups = runtime.engine_groups
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # What this node can do beyond the stream itself: the control plane asks only those.
    features = [*FEATURES, *(t for t in ("ibnetdiscover", "ib_write_bw") if shutil.which(t))]
    settings = SessionSettings(heartbeat_interval=opts.heartbeat_interval, features=features)
    log.info("agent for node %s; control planes %s", state.node_id, ", ".join(state.control_planes))
    port = None
    if opts.metrics_listen:
        port = MetricsPort(
            opts.metrics_listen, NodeMetrics(state.node_id), runtime.supervisor.engine_targets
        )
        runtime.metrics_token = port.take_token
        runtime.firewall.metrics_port = parse_hostport(opts.metrics_listen)[1]
        runtime.firewall.metrics_scrapers = opts.metrics_scrapers
    try:
        await runtime.start()
        if port is not None:
            await port.start()
        sent = port.metrics.sent if port is not None else None
        await keep_connected(state, source, settings, stop, runtime, sent)
    finally:
        if port is not None:
            await port.close()
        await runtime.close()
        await source.close()
        await asyncio.to_thread(tracing.shutdown)
