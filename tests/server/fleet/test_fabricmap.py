"""Each fabric's map read by one of its nodes (the first with ibnetdiscover), parsed and
kept with its age; its problems joined to the fabric's; a node that cannot read it
leaves the reason, and the last map stays."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from llmgw.server.api.fabrics import routes
from llmgw.server.fleet.fabricmap import EVERY, FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.wire.messages import Response
from tests.server.fleet.test_fabrics import SM_A, port

OWN = Path(__file__).resolve().parents[2] / "fixtures" / "infiniband"
MAP = (OWN / "ibnetdiscover_2tier-rails_HDR_own.txt").read_text()


class Session:
    def __init__(self, answer: Response) -> None:
        self.answer = answer
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        self.asked.append((kind, args))
        yield self.answer


class Registry:
    def __init__(self, *views: NodeView) -> None:
        self.nodes = {v.id: v for v in views}


def view(node_id: str, session: Session | None, features: list[str]) -> NodeView:
    v = NodeView(id=node_id, cert_serial=1)
    v.live.ib_ports = [port("mlx5_0"), port("mlx5_1", state="DOWN")]
    v.session = cast(Any, session)
    v.features = features
    return v


def listing(watch: FabricWatch, maps: FabricMaps, registry: Registry) -> Any:
    """GET /api/v1/fabrics's handler."""
    ops = routes(FabricService(watch, maps, cast(NodeRegistry, registry)))
    return next(op.handler for op in ops if op.method == "GET" and op.path == "/api/v1/fabrics")


NOW = [5000.0]


def clock() -> float:
    return NOW[0]


def later() -> None:
    """Five minutes on: every fabric's map is due again."""
    NOW[0] += EVERY


async def test_one_node_per_fabric_reads_the_map_and_its_problems_join_the_fabrics() -> None:
    plain = Session(Response(id="x", result={"text": "never asked"}))
    able = Session(Response(id="x", result={"text": MAP}))
    registry = Registry(
        view("a-no-tool", plain, ["heartbeat.v1"]),
        view("b-tool", able, ["heartbeat.v1", "ibnetdiscover"]),
        view("c-tool", Session(Response(id="x", result={"text": MAP})), ["ibnetdiscover"]),
    )
    watch = FabricWatch(clock)
    maps = FabricMaps(cast(NodeRegistry, registry), watch, clock=clock)
    await maps.poll()
    assert plain.asked == []
    assert able.asked == [("fabric.discover", {"device": "mlx5_0", "port": 1})]
    shown = maps.topology(SM_A)
    assert shown is not None and shown["read_by"] == "b-tool" and shown["age_seconds"] == 0
    assert shown["read_at"] == NOW[0]
    assert sorted(set(shown["tiers"].values())) == ["leaf", "spine"]
    assert shown["rail_misses"] and shown["rail_misses"][0]["host"] == "gpu-05"
    assert any("2x" in (link["degraded"] or "") for link in shown["links"])

    get = listing(watch, maps, registry)
    found = await get(cast(Any, None))
    (fabric,) = found["fabrics"]
    assert fabric["topology_read_at"] == NOW[0]
    problems = " | ".join(fabric["problems"])
    assert "gpu-05" in problems and "2x" in problems


async def test_a_node_that_cannot_read_leaves_the_reason_and_the_last_map() -> None:
    session = Session(Response(id="x", result={"text": MAP}))
    registry = Registry(view("b", session, ["ibnetdiscover"]))
    maps = FabricMaps(cast(NodeRegistry, registry), FabricWatch(clock), clock=clock)
    await maps.poll()
    session.answer = Response(id="x", ok=False, error="ibnetdiscover failed (exit 1): no port")
    await maps.poll()
    assert maps.problems(SM_A) == maps.topology(SM_A)["problems"]  # not due: not asked
    later()
    await maps.poll()
    assert maps.topology(SM_A) is not None  # the last map stays
    assert (
        maps.problems(SM_A)[0]
        == "b could not read the fabric: ibnetdiscover failed (exit 1): no port"
    )


async def test_no_node_with_the_tool_says_so() -> None:
    registry = Registry(view("a", Session(Response(id="x")), ["heartbeat.v1"]))
    maps = FabricMaps(cast(NodeRegistry, registry), FabricWatch(clock), clock=clock)
    await maps.poll()
    assert maps.topology(SM_A) is None
    assert maps.problems(SM_A) == ["no node of this fabric has ibnetdiscover (infiniband-diags)"]


async def test_every_sm_the_sa_knows_and_no_standby_is_a_problem() -> None:
    alone = [{"guid": SM_A, "lid": 1, "priority": 15, "state": "MASTER", "activity": 9}]
    session = Session(Response(id="x", result={"text": MAP, "smir": alone}))
    registry = Registry(view("b", session, ["ibnetdiscover"]))
    watch = FabricWatch(clock)
    maps = FabricMaps(cast(NodeRegistry, registry), watch, clock=clock)
    await maps.poll()
    get = listing(watch, maps, registry)
    (fabric,) = (await get(cast(Any, None)))["fabrics"]
    assert fabric["subnet_manager_records"] == alone
    assert any(p.startswith("no standby subnet manager (1 SM(s)") for p in fabric["problems"])
    standby = {"guid": "0x0c42a10300b5d8ff", "lid": 7, "priority": 13, "state": "STANDBY"}
    session.answer = Response(id="x", result={"text": MAP, "smir": [*alone, standby]})
    later()
    await maps.poll()
    (fabric,) = (await get(cast(Any, None)))["fabrics"]
    assert fabric["subnet_managers"] == [SM_A, "0x0c42a10300b5d8ff"]
    assert not any("standby" in p for p in fabric["problems"])
