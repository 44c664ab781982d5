"""Both ends of the agent stream joined in memory: an AgentStream and a NodeStream
passing bytes by hand, so a test decides who reads and when. No sockets, no clock."""

from __future__ import annotations

from llmgw.agent import stream as agent
from llmgw.server.fleet import stream as server
from llmgw.wire import HostFacts, Register, Registered


def register(node_id: str = "n1") -> Register:
    return Register(
        node_id=node_id, version="t", host=HostFacts(hostname=node_id, os="test", arch="x86_64")
    )


class Pair:
    def __init__(self, node_id: str = "n1", register_as: str | None = None) -> None:
        self.agent = agent.AgentStream(entropy=lambda n: b"\x00" * n)
        self.node = server.NodeStream(node_id)
        self.node.start()
        self.agent.connect("cp.test:7443", register(register_as or node_id))
        self.to_agent: list[agent.StreamEvent] = []
        self.to_node: list[server.StreamEvent] = []

    def up(self) -> list[server.StreamEvent]:
        """Carry what the agent has to send to the control plane; what that meant."""
        return self._up(self.agent.data_to_send())

    def down(self) -> list[agent.StreamEvent]:
        """Carry what the control plane has to send to the agent; what that meant."""
        return self._down(self.node.data_to_send())

    def settle(self, rounds: int = 100) -> None:
        """Both ways until neither has anything left to say."""
        for _ in range(rounds):
            up, down = self.agent.data_to_send(), self.node.data_to_send()
            if not up and not down:
                return
            self._up(up)
            self._down(down)
        raise AssertionError(f"still talking after {rounds} rounds")

    def _up(self, data: bytes) -> list[server.StreamEvent]:
        events = self.node.receive(data) if data else []
        self.to_node += events
        return events

    def _down(self, data: bytes) -> list[agent.StreamEvent]:
        events = self.agent.receive(data) if data else []
        self.to_agent += events
        return events

    def registered(self) -> Pair:
        """Settle, accept the Register as the agents' port does, and settle again."""
        self.settle()
        assert any(isinstance(e, server.Registering) for e in self.to_node), self.to_node
        self.node.send(Registered(node_id=self.node.node_id, heartbeat_interval=5.0))
        self.settle()
        assert self.agent.registered is not None
        return self
