"""The Fabrics and NVLink racks pages over the recorded 64-node fleet
(``tests/support/fleet64.py``), rendered in process through the pages' own steps
(session, headers): both InfiniBand fabrics with their SMs, problems and maps drawn as
spine and leaf tiers (each leaf with its hosts, the degraded cable marked), and the
NVL72 rack of 18 trays with the card that has not joined."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from llmgw.server.access import Gate
from llmgw.server.fleet.fabricservice import FabricService
from llmgw.server.pages import fabricpages
from llmgw.server.pages.frame import Frame
from llmgw.server.sessions import COOKIE, Sessions
from tests.server.pages.test_fabric_pages import text
from tests.support import fleet64
from tests.support.fleet64 import (
    CLUSTER_UUID,
    FABRIC_A,
    FABRIC_A_STANDBY,
    FABRIC_B,
    TRAYS,
)

SESSIONS = Sessions(b"f" * 32, lambda: ["h"])


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    maps = fleet64.fabric_maps()
    frame = Frame(Gate(lambda token: False, lambda: None, SESSIONS), lambda: None)
    fabrics = FabricService(maps.watch, maps, maps.registry)
    pages = fabricpages.pages(frame, fabrics, maps.registry)
    app = Starlette(routes=[Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://cp",
        headers={"cookie": f"{COOKIE}={SESSIONS.open('viewer@test', 'viewer', 'h')}"},
    ) as c:
        yield c


def tier(section: str, name: str) -> str:
    """One tier's row of the drawn map."""
    return section.split(f'class="tier tier-{name}"')[1].split('class="tier tier-')[0]


def leaf_hosts(section: str, leaf: str) -> list[str]:
    """The adapters drawn under one leaf switch, in order."""
    block = section.split(f"<strong>{leaf}</strong>")[1].split("</ul>")[0]
    return [text(li).strip() for li in re.findall(r"<li[^>]*>(.*?)</li>", block)]


async def test_the_fabrics_page_shows_both_fabrics_tiers_and_problems(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/admin/fabrics")
    assert answer.status_code == 200
    page = answer.text
    a, b = page.split(f'id="fabric-{FABRIC_A}"')[1].split(f'id="fabric-{FABRIC_B}"')
    b = b.split('<section class="grid">')[0]

    # Fabric A: its master and the standby its SA knows, 30 nodes, the port in INIT.
    assert f'<code class="sm-master">{FABRIC_A}</code>' in a
    assert f'<code class="sm-other">{FABRIC_A_STANDBY}</code>' in a
    assert '<tr class="sm-standby"><td><code>' + FABRIC_A_STANDBY in a
    words_a = text(a)
    assert "Nodes 30 Ports 240: 239 ACTIVE 1 INIT" in words_a
    assert "Active rates 238 at 400 Gb/s, 1 at 200 Gb/s" in words_a
    assert "1 port(s) in INIT or ARMED (a-23 mlx5_5/1)" in words_a
    assert "Fix: check the SM (`sminfo`, its log)" in words_a
    assert (
        "Read 2 min ago by a-01 · 20 switches · 240 adapters on 30 hosts · 368 cables · 1 degraded"
    ) in words_a
    # The map: four spines over sixteen rail leaves; SU1's leaves carry a-01..a-16 and
    # SU2's a-17..a-30; the degraded cable marked on its adapter and listed.
    spines = re.findall(r"<strong>([^<]+)</strong>", tier(a, "spine"))
    assert spines == [f"a-spine-{k}" for k in range(1, 5)]
    leaves = re.findall(r"<strong>([^<]+)</strong>", tier(a, "leaf"))
    assert leaves == [f"a-su{su}-rail{r}" for su in (1, 2) for r in range(8)]
    assert "↕32" in tier(a, "spine") and "↕8" in tier(a, "leaf")
    assert leaf_hosts(a, "a-su1-rail0") == [f"a-{n:02d} mlx5_0" for n in range(1, 17)]
    assert leaf_hosts(a, "a-su2-rail7") == [f"a-{n:02d} mlx5_7" for n in range(17, 31)]
    assert re.search(
        r'<li class="degraded">a-07 mlx5_3 <span class="bad">✗ trained at HDR, below the NDR', a
    )
    assert (
        "degraded: a-su1-rail3 port 7 ↔ a-07 mlx5_3: 4x HDR (200 Gb/s), trained at HDR, "
        "below the NDR of both ends"
    ) in words_a
    assert "off its rail:" not in words_a

    # Fabric B: one SM and no standby (a problem), 16 nodes under one set of leaves.
    words_b = text(b)
    assert f'<code class="sm-master">{FABRIC_B}</code>' in b and "sm-other" not in b
    assert "Nodes 16 Ports 128: 128 ACTIVE Active rates 128 at 400 Gb/s" in words_b
    assert "no standby subnet manager (1 SM(s) known to the fabric, none STANDBY)" in words_b
    assert "Fix: run a second opensm at a lower priority on another host" in words_b
    assert "Read 2 min ago by b-01 · 10 switches · 128 adapters on 16 hosts" in words_b
    assert re.findall(r"<strong>([^<]+)</strong>", tier(b, "spine")) == ["b-spine-1", "b-spine-2"]
    assert re.findall(r"<strong>([^<]+)</strong>", tier(b, "leaf")) == [
        f"b-su1-rail{r}" for r in range(8)
    ]
    assert leaf_hosts(b, "b-su1-rail4") == [f"b-{n:02d} mlx5_4" for n in range(1, 17)]
    assert 'class="degraded"' not in b

    rest = text(page.split('<section class="grid">')[1])
    assert "RoCE networks None seen." in rest and "Ports of no fabric" in rest


async def test_the_nvlink_page_draws_the_rack_of_18_trays(client: httpx.AsyncClient) -> None:
    answer = await client.get("/admin/nvlink")
    assert answer.status_code == 200
    page = answer.text
    words = text(page)
    assert f"Domain {CLUSTER_UUID} · clique 2" in words
    assert "18 trays · 72 cards: 71 joined, 1 not joined · IMEX up on 18" in words
    assert page.count('<article class="rack"') == 1
    rows = page.split("<tbody>")[1].split("</tbody>")[0].split("<tr")[1:]
    assert [re.findall(r'href="/admin/nodes/([^"]+)"', r)[0] for r in rows] == list(TRAYS)
    looks = [re.findall(r'class="cell nv-(\w+)"', r) for r in rows]
    assert looks[12] == ["joined", "joined", "notjoined", "joined"]
    assert all(cells == ["joined"] * 4 for i, cells in enumerate(looks) if i != 12)
    assert all('class="imex-up">up' in r and "(1 channel(s))" in text(r) for r in rows)
    assert "card 2 not joined: In Progress" in text(rows[12])
    assert "nvl-13 card 2 has not joined NVLink domain" in words
    assert words.count("Fix: ") == 1
    unjoined = text(page.split("Unjoined cards")[1])
    assert re.search(r"nvl-13 card 2 GPU-[0-9a-f-]{36}: In Progress", unjoined)
    # The H100 boards' own NVSwitch fabric is no domain.
    assert "a-01" not in page and "b-01" not in page
