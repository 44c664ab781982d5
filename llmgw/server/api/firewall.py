"""``/api/v1/firewall``: llmgw's firewall on every node (``ctl firewall``), changed live."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.fleet.firewall import FleetFirewall
from llmgw.server.requests import FirewallSet
from llmgw.wire.admin import FirewallChangeJson, FirewallJson

DOC = {"type": "object", "required": ["version", "enabled", "networks", "source"]}


def routes(firewall: FleetFirewall) -> Ops:
    def shown() -> FirewallJson:
        return firewall.document()

    async def get(call: Call[None, None]) -> FirewallJson:
        return shown()

    async def put(call: Call[FirewallSet, None]) -> FirewallJson:
        await firewall.ask(call.body, call.principal)
        return shown()

    async def history(call: Call[None, None]) -> list[FirewallChangeJson]:
        return await firewall.history()

    return [
        Op(
            "GET",
            "/api/v1/firewall",
            get,
            "llmgw's firewall on every node: on or off, the agents' networks",
            answer=DOC,
        ),
        Op(
            "POST",
            "/api/v1/firewall",
            put,
            "Turn the firewall on or off, or name the agents' networks (audited; every "
            "agent loads its table at once)",
            body=FirewallSet,
            answer=DOC,
            access="admin",
        ),
        Op(
            "GET",
            "/api/v1/firewall/history",
            history,
            "Every change of the firewall, newest first",
            answer={"type": "array", "items": {"type": "object"}},
        ),
    ]
