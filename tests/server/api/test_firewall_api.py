"""``/api/v1/firewall`` on a real control plane: a change is what the next ``Firewall``
message every agent is sent says, and the agent's plan of its table follows it, with no
restart of anything."""

from __future__ import annotations

import httpx

from llmgw.agent.nodewall import plan_of
from llmgw.server.app import ControlPlane
from llmgw.wire.messages import Firewall


def firewall_for(cp: ControlPlane, node: str) -> Firewall:
    found = [m for m in cp.pushed_for(node, "127.0.0.1") if isinstance(m, Firewall)]
    assert len(found) == 1
    return found[0]


async def test_a_change_reaches_the_agents_plan_without_a_restart(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, client = plane
    # A change pushes what the cluster decides to every connected agent (no agent is
    # connected here: the push is counted on its way).
    assert cp.firewall.on_change == cp._settings_changed
    pushes: list[str] = []

    def push() -> None:
        pushes.append("pushed")
        cp._settings_changed()

    cp.firewall.on_change = push

    shown = (await client.get("/api/v1/firewall")).json()
    assert shown["enabled"] is True and shown["networks"] == []
    before = plan_of(firewall_for(cp, "n1"))
    assert before.enabled and before.networks == () and before.agent_port is None

    answer = await client.post("/api/v1/firewall", json={"enabled": False})
    assert answer.status_code == 200, answer.text
    assert answer.json()["source"]["enabled"] == "ctl"
    assert pushes == ["pushed"]
    assert plan_of(firewall_for(cp, "n1")).enabled is False

    answer = await client.post(
        "/api/v1/firewall", json={"enabled": True, "networks": ["10.20.0.0/16"]}
    )
    assert answer.status_code == 200, answer.text
    plan = plan_of(firewall_for(cp, "n1"))
    assert plan.enabled and plan.networks == ("10.20.0.0/16",)
    # On a control plane's own machine (here: loopback) the agents' port is kept too.
    assert plan.agent_port == cp.config.agent_port
    assert pushes == ["pushed", "pushed"]

    history = (await client.get("/api/v1/firewall/history")).json()
    assert [h["action"] for h in history] == ["firewall.set", "firewall.set"]


async def test_a_bad_network_is_refused_naming_it(
    plane: tuple[ControlPlane, httpx.AsyncClient],
) -> None:
    cp, client = plane
    answer = await client.post("/api/v1/firewall", json={"networks": ["10.0.0.5/24"]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "networks" and "10.0.0.5/24" in error["message"]
    assert cp.firewall.version == 0
    answer = await client.post("/api/v1/firewall", json={"enabled": "yes"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "enabled"
