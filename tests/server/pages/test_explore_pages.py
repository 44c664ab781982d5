"""The Explore pages, rendered in process through the pages' own steps over the explorer
(a hub stand-in, the recorded 64-node fleet and a CPU node): the list with what it
judged by, a repository's sets with a Serve button only where a set fits, English and
Turkish, and a hub that stalls or answers garbage said on a page that still renders."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from llmgw.server.access import Gate
from llmgw.server.catalog.explore import ExploreService
from llmgw.server.catalog.scheduler import NodeCapacity
from llmgw.server.pages import explorepages
from llmgw.server.pages.frame import Frame
from llmgw.server.sessions import COOKIE, Sessions
from tests.server.catalog.test_explore import fleet
from tests.server.pages.inprocess import Site
from tests.support.hubstandin import HubStandIn
from tests.support.ports import free_port

SESSIONS = Sessions(b"s" * 32, lambda: ["h"])


def as_(role: str) -> dict[str, str]:
    return {"cookie": f"{COOKIE}={SESSIONS.open(f'{role}@test', role, 'h')}"}  # type: ignore[arg-type]


def text(page: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page))).strip()


def row(page: str, rid: str) -> str:
    found = re.search(rf'<tr id="{rid}"[^>]*>(.*?)</tr>', page, re.S)
    assert found is not None, rid
    return found.group(1)


async def client_of(hub: HubStandIn) -> AsyncIterator[httpx.AsyncClient]:
    views = fleet()
    explorer = ExploreService(
        lambda: views,
        lambda: [NodeCapacity.from_view(v) for v in views.values()],
        lambda: hub.url,
        environ={},
        timeout=0.5,
    )
    frame = Frame(Gate(lambda token: False, lambda: None, SESSIONS), lambda: None)
    pages = explorepages.pages(frame, explorer)
    app = Starlette(routes=[Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp") as c:
        yield c


@pytest.fixture
async def hub() -> AsyncIterator[HubStandIn]:
    async with HubStandIn() as standin:
        yield standin


@pytest.fixture
async def client(hub: HubStandIn) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_of(hub):
        yield c


async def test_the_list_says_each_verdict_and_what_it_judged_by(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/admin/explore", headers=as_("operator"))
    assert answer.status_code == 200
    assert "default-src 'none'" in answer.headers["content-security-policy"]
    page = answer.text
    judged = text(row(page, "repo-Qwen--Qwen3-8B"))
    assert "Qwen/Qwen3-8B" in judged and "8.2 B" in judged and "BF16" in judged
    assert "1 card(s) on a-01" in judged and "fits 65 nodes" in judged
    small = text(row(page, "repo-Qwen--Qwen2.5-0.5B-Instruct-GGUF"))
    assert "CPU on cpu-1" in small and "tokens/s" in small
    huge = text(row(page, "repo-unsloth--DeepSeek-R1-GGUF"))
    assert "fits no node" in huge and "needs" in huge and "best node" in huge
    said = text(page)
    assert "Judged by the nodes as they are now (65):" in said
    assert "largest card NVIDIA GB200" in said and "compute capability 10.0" in said
    assert "most RAM on one node 2.0 TiB (a-01)" in said
    assert 'href="/admin/explore/Qwen/Qwen3-8B"' in page


async def test_search_and_fits_are_asked_of_the_explorer(
    client: httpx.AsyncClient, hub: HubStandIn
) -> None:
    answer = await client.get(
        "/admin/explore?q=Qwen3&fits=1&sort=likes&other=x", headers=as_("admin")
    )
    assert answer.status_code == 200
    assert hub.asked[-1].query["search"] == "Qwen3" and hub.asked[-1].query["sort"] == "likes"
    rows = re.findall(r'<tr id="repo-[^"]+" class="(\w+)"', answer.text)
    assert rows and set(rows) == {"fits"}
    assert 'value="Qwen3"' in answer.text and "checked" in answer.text
    refused = await client.get("/admin/explore?sort=newest", headers=as_("admin"))
    assert refused.status_code == 400 and "sort" in text(refused.text)


async def test_viewers_may_not_explore(client: httpx.AsyncClient) -> None:
    answer = await client.get("/admin/explore", headers=as_("viewer"))
    assert answer.status_code == 403


async def test_a_repository_page_serves_what_fits_with_the_serve_forms_checks(
    client: httpx.AsyncClient,
) -> None:
    page = (await client.get("/admin/explore/Qwen/Qwen3-8B", headers=as_("operator"))).text
    fits = row(page, "set-1")
    assert 'action="/admin/models"' in fits
    assert 'name="source" value="hf:Qwen/Qwen3-8B"' in fits
    assert 'name="gpus" value="1"' in fits and 'name="csrf"' in fits
    gguf = (
        await client.get("/admin/explore/unsloth/DeepSeek-R1-GGUF", headers=as_("operator"))
    ).text
    for n in range(1, 5):
        shown = row(gguf, f"set-{n}")
        assert "<form" not in shown and "fits no node" in text(shown)
    assert "hf:unsloth/DeepSeek-R1-GGUF:Q4_K_M" in text(row(gguf, "set-2"))
    small = (
        await client.get("/admin/explore/Qwen/Qwen2.5-0.5B-Instruct-GGUF", headers=as_("operator"))
    ).text
    assert 'name="gpus" value="0"' in row(small, "set-1")
    missing = await client.get("/admin/explore/no/such", headers=as_("operator"))
    assert missing.status_code == 404


async def test_in_turkish(client: httpx.AsyncClient) -> None:
    headers = {**as_("operator"), "accept-language": "tr"}
    page = (await client.get("/admin/explore", headers=headers)).text
    said = text(page)
    assert "Keşfet" in said and "Yalnızca sığanlar" in said
    assert "Düğümlerin şu anki durumuna göre değerlendirildi (65):" in said
    repo = (await client.get("/admin/explore/Qwen/Qwen3-8B", headers=headers)).text
    assert "a-01 üzerinde 1 kart" in text(repo) and "Dosya kümesi" in text(repo)


@pytest.mark.parametrize(
    ("mode", "said"), [("stall", "did not answer within 0.5 s"), ("garbage", "not JSON")]
)
async def test_a_bad_hub_is_said_on_a_page_that_still_renders(mode: str, said: str) -> None:
    async with HubStandIn(mode) as bad:
        async for c in client_of(bad):
            for path in ("/admin/explore", "/admin/explore/Qwen/Qwen3-8B"):
                answer = await c.get(path, headers=as_("operator"))
                assert answer.status_code == 200
                error = re.search(r'<p class="warn" id="hub-error">(.*?)</p>', answer.text, re.S)
                assert error is not None and said in html.unescape(error.group(1))
                assert "Judged by the nodes as they are now (65):" in text(answer.text)


async def test_the_real_site_serves_explore_to_operators_from_its_nav(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control plane's own pages: the nav's link, and a hub that refuses (a closed
    port on loopback) said on the page."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    page = await site.page("/admin/explore", "operator")
    assert 'href="/admin/explore" aria-current="page"' in page
    error = re.search(r'<p class="warn" id="hub-error">(.*?)</p>', page, re.S)
    assert error is not None and "cannot reach 127.0.0.1" in html.unescape(error.group(1))
    assert "Judged by the nodes as they are now (0):" in text(page)
    assert 'href="/admin/explore"' not in await site.page("/admin/models", "viewer")
