"""The Fabrics and NVLink racks pages, rendered in process through the pages' own steps
(session, headers) over a small fleet: two InfiniBand fabrics (one with stuck ports and
no map, one whose map has a degraded cable and an adapter off its rail), a RoCE network,
a port of no fabric, and an NVLink rack with a card that did not join, one not read, and
IMEX down on one tray."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from llmgw.server.access import Gate
from llmgw.server.fleet.fabricmap import FabricMaps
from llmgw.server.fleet.fabrics import FabricWatch
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.pages import fabricpages, i18n
from llmgw.server.pages.frame import Frame
from llmgw.server.sessions import COOKIE, Sessions
from llmgw.wire.hardware import GpuHealth, IbPort, NodeVitals
from llmgw.wire.messages import Response
from tests.server.fleet.test_fabricmap import MAP, Registry, Session
from tests.server.fleet.test_fabrics import SM_A, SM_C, port

CLUSTER = "7e3c0a52-18f4-4d2b-b6a9-3f0d8c21e945"
STANDBY = "0x0c42a10300b5d801"
SMIR = [
    {"guid": SM_A, "lid": 1, "priority": 15, "state": "MASTER", "activity": 482113},
    {"guid": STANDBY, "lid": 2, "priority": 14, "state": "STANDBY", "activity": 0},
]


def ib_node(node_id: str, ports: list[IbPort], mapper: bool = False) -> NodeView:
    view = NodeView(id=node_id, cert_serial=1)
    view.live.ib_ports = ports
    answer = Response(id="x", result={"text": MAP, "smir": SMIR})
    view.session = cast(Any, Session(answer))
    view.features = ["ibnetdiscover"] if mapper else []
    return view


def card(i: int, **fabric: Any) -> dict[str, Any]:
    joined = {
        "index": i,
        "uuid": f"GPU-{i}",
        "fabric_state": "Completed",
        "fabric_status": "Success",
        "fabric_cluster_uuid": CLUSTER,
        "fabric_clique_id": 1,
        "fabric_health": {"summary": "Healthy", "bandwidth": "Full"},
    }
    return {**joined, **fabric}


def tray(node_id: str, cards: list[dict[str, Any]], imex: bool | None) -> NodeView:
    view = NodeView(id=node_id, cert_serial=1)
    view.session = cast(Any, object())
    view.live.gpu_health = [
        GpuHealth(**{**c, "uuid": f"GPU-{node_id}-{c['index']}"}) for c in cards
    ]
    if imex is not None:
        view.live.vitals = NodeVitals(imex_running=imex, imex_channels=1)
    return view


def fleet() -> list[NodeView]:
    return [
        # Fabric SM_A: mapped by g1 (the map: a degraded cable, gpu-05 off its rail).
        # Fabric SM_C: a port stuck in INIT, and no node that can map it.
        ib_node("g1", [port("mlx5_0"), port("mlx5_1", master=SM_C, state="INIT")], mapper=True),
        ib_node("g2", [port("mlx5_0"), port("mlx5_1", master=SM_C, rate_gbps=None)]),
        ib_node(
            "g3",
            [
                port("mlx5_2", master=None, rate_gbps=None),
                port("mlx5_3", master=None, layer="Ethernet", roce_networks=["10.20.0.0/16"]),
            ],
        ),
        tray("gb-tray-01", [card(i) for i in range(4)], imex=True),
        tray(
            "gb-tray-02",
            [
                card(0),
                card(1, fabric_status="Failure"),
                card(2, fabric_state=None, fabric_status=None, fabric_health=None),
                card(3),
            ],
            imex=False,
        ),
        tray(
            "gb-tray-03",
            [
                *(card(i) for i in range(3)),
                card(
                    3,
                    fabric_state="Not Started",
                    fabric_status=None,
                    fabric_cluster_uuid=None,
                    fabric_clique_id=None,
                    fabric_health=None,
                ),
            ],
            imex=None,
        ),
    ]


SESSIONS = Sessions(b"s" * 32, lambda: ["h"])


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    registry = Registry(*fleet())
    watch = FabricWatch(lambda: 5000.0)
    maps = FabricMaps(cast(NodeRegistry, registry), watch, clock=lambda: 5000.0)
    await maps.poll()
    frame = Frame(Gate(lambda token: False, lambda: None, SESSIONS), lambda: None)
    nodes = cast(NodeRegistry, registry)
    pages = fabricpages.pages(frame, FabricService(watch, maps, nodes), nodes)
    app = Starlette(routes=[Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as c:
        yield c


def viewer() -> dict[str, str]:
    return {"cookie": f"{COOKIE}={SESSIONS.open('viewer@test', 'viewer', 'h')}"}


def text(page: str) -> str:
    """The page's words, tags dropped and spaces squeezed."""
    words = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return re.sub(r" ([,:;)])", r"\1", words)


async def test_without_a_session_both_pages_go_to_sign_in(client: httpx.AsyncClient) -> None:
    for path in ("/admin/fabrics", "/admin/nvlink"):
        answer = await client.get(path)
        assert answer.status_code == 303
        assert answer.headers["location"] == f"/admin/login?next={path}"
        assert "default-src 'none'" in answer.headers["content-security-policy"]


async def test_the_fabrics_page_shows_sms_problems_with_fixes_and_the_map(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/admin/fabrics", headers=viewer())
    assert answer.status_code == 200
    assert "default-src 'none'" in answer.headers["content-security-policy"]
    page = answer.text
    words = text(page)
    assert "<style" not in page and "<script>" not in page and " style=" not in page
    assert 'href="/admin/fabrics" aria-current="page"' in page
    a, c = page.split(f'id="fabric-{SM_A}"')[1].split(f'id="fabric-{SM_C}"')
    # The mapped fabric: its master, the standby the SA knows, both SM records.
    assert f'<code class="sm-master">{SM_A}</code>' in a
    assert f'<code class="sm-other">{STANDBY}</code>' in a
    assert "STANDBY" in a and "482113" in a
    # Its map: tiers, hosts under the leaves, the degraded cable with its reason, the
    # adapter off its rail.
    assert "spine-1" in a and "leaf-3" in a
    assert re.search(r"<li class=\"degraded\">gpu-02 mlx5_1 <span class=\"bad\">✗ 4x port", a)
    assert re.search(r'<li class="offrail">gpu-05 mlx5_1 <span class="warn">⚠', a)
    mapped = text(a)
    assert "degraded: leaf-2 port 2 ↔ gpu-02 mlx5_1: 2x HDR (100 Gb/s), 4x port running" in mapped
    assert (
        "gpu-05 mlx5_1 is on leaf-1 port 7, which carries mlx5_0; its rail is on leaf-2, leaf-3"
        in mapped
    )
    assert "Read 0 s ago by g1" in mapped
    # The other fabric: the stuck port with its fix, split; why it has no map.
    stuck = text(c)
    assert "1 port(s) in INIT or ARMED (g1 mlx5_1/1)" in stuck
    assert "Fix: check the SM (`sminfo`, its log)" in stuck
    assert "No map yet: no node of this fabric has ibnetdiscover" in stuck
    assert f'<code class="sm-master">{SM_C}</code>' in c
    # Ports by state and rate: g2's active port has no rate read: not counted at 0.
    assert "Ports 2: 1 ACTIVE 1 INIT Active rates 1 rate not read" in stuck
    assert "Ports 2: 2 ACTIVE Active rates 2 at 400 Gb/s" in mapped
    # RoCE, and the port of no fabric with its rate not read (never 0).
    assert "10.20.0.0/16" in words and "g3 mlx5_3/1 400 Gb/s" in words
    unassigned = text(page.split("Ports of no fabric")[1])
    assert "g3 mlx5_2/1 ACTIVE not read" in unassigned
    assert " 0 Gb/s" not in words


async def test_the_nvlink_page_draws_the_rack_imex_problems_and_unjoined_cards(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/admin/nvlink", headers=viewer())
    assert answer.status_code == 200
    page = answer.text
    words = text(page)
    assert f"Domain {CLUSTER} · clique 1" in words
    assert "3 trays · 12 cards: 9 joined, 2 not joined, 1 not read" in words
    assert "IMEX up on 1, down on 1, not read on 1" in words
    rows = page.split("<tbody>")[1].split("</tbody>")[0].split("<tr")[1:]
    assert [re.findall(r'class="cell nv-(\w+)"', r) for r in rows] == [
        ["joined"] * 4,
        ["joined", "notjoined", "unknown", "joined"],
        ["joined"] * 3 + ["notjoined"],
    ]
    assert 'class="imex-down">down' in rows[1]
    assert 'class="imex-unknown"><span class="unread">not read' in rows[2]
    assert "card 2: state not read" in text(rows[1])
    # A problem for each card that did not join and for IMEX, each with its fix.
    assert "gb-tray-02 card 1 has not joined NVLink domain" in words
    assert "IMEX is not running on gb-tray-02, in a domain of 3 nodes" in words
    assert "Fix: start it (`systemctl enable --now nvidia-imex`)" in words
    assert words.count("Fix: ") >= 4
    unjoined = text(page.split("Unjoined cards")[1])
    assert "gb-tray-03 card 3 GPU-gb-tray-03-3: Not Started" in unjoined


async def test_the_pages_speak_turkish(client: httpx.AsyncClient) -> None:
    _ = i18n.translator("tr")
    turkish = {**viewer(), "accept-language": "tr"}
    fabrics = (await client.get("/admin/fabrics", headers=turkish)).text
    assert _("Other SMs seen") in text(fabrics) and _("off its rail") in fabrics
    nvlink = (await client.get("/admin/nvlink", headers=turkish)).text
    assert _("Unjoined cards") in nvlink and "Unjoined cards" not in nvlink


async def test_htmx_gets_the_body_alone(client: httpx.AsyncClient) -> None:
    for path, box in (("/admin/fabrics", "fabrics"), ("/admin/nvlink", "nvlink")):
        answer = await client.get(path, headers={**viewer(), "hx-request": "true"})
        assert answer.status_code == 200
        assert answer.text.startswith(f'<div id="{box}" hx-get="{path}"')
        assert "<html" not in answer.text
