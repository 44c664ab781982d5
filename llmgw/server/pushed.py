"""What the cluster decides for each node and sends it over its stream when it
registers and whenever it changes: its agent settings (``ctl config``), its engines
(``ctl engines``; offline, from this control plane's mirror), llmgw's firewall on it,
its part in Slurm, and the cluster's metrics token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmgw.config import ServerConfig, parse_hostport
from llmgw.offline.mirrorfiles import MirrorFiles
from llmgw.server.fleet.agentsettings import AgentSettings
from llmgw.server.fleet.engines import FleetEngines
from llmgw.server.fleet.firewall import FleetFirewall
from llmgw.server.mirror import offline_pushed
from llmgw.server.slurm.service import SlurmService
from llmgw.wire.messages import AgentSettings as AgentSettingsMessage
from llmgw.wire.messages import Firewall, Message, MetricsAccess


@dataclass(frozen=True)
class Pushed:
    config: ServerConfig
    settings: AgentSettings
    engines: FleetEngines
    firewall: FleetFirewall
    slurm: SlurmService
    mirror: MirrorFiles | None
    api_addresses: list[str]
    # The agents' addresses of every control plane (the agents' port's, when it runs).
    control_planes: Callable[[], list[str]]
    # The cluster's metrics token, which the agents' own metrics ask of a scraper.
    metrics_token: str

    def __call__(self, node_id: str, local: str | None) -> list[Message]:
        """What the cluster decides for ``node_id`` (``local``: the address the node
        reached this control plane at)."""
        s = self.settings
        wall = self.firewall.current
        hosts = {parse_hostport(a)[0] for a in self.control_planes()}
        hosts |= {local} if local else set()
        # Offline: the agents install from this control plane's mirror.
        default, engines = offline_pushed(
            self.mirror, s.default, self.engines.message(node_id), local, self.api_addresses
        )
        return [
            AgentSettingsMessage(
                # The layers as they are: encoding copies them (document() deep-copies
                # every node's, once per agent of a push).
                version=s.version,
                default=default,
                node=s.nodes.get(node_id, {}),
            ),
            engines,
            Firewall(
                enabled=wall.enabled,
                networks=list(wall.networks),
                control_planes=sorted(hosts),
                engine_ports=self.config.scheduling.engine_ports,
                agent_port=self.config.agent_port,
            ),
            self.slurm.message_for(node_id),
            MetricsAccess(token=self.metrics_token),
        ]
