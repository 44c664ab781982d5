"""The mirror page, rendered in process through the pages' own steps over a stand-in
for the mirror: each repository with its files and format, a pickle-only set marked with
how to get its safetensors, the engine archives and llmgw releases with their sha256, and
a mirror that is off or empty said to be so."""

from __future__ import annotations

import html
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from llmgw.offline.manifest import BundleFile
from llmgw.offline.mirrorfiles import MirrorHeld
from llmgw.server.access import Gate
from llmgw.server.mirror import MirrorState
from llmgw.server.pages import mirrorpages
from llmgw.server.pages.frame import Frame
from llmgw.server.sessions import COOKIE, Sessions

SESSIONS = Sessions(b"s" * 32, lambda: ["h"])


def model(repo: str, path: str, size: int, hub: bool = True) -> BundleFile:
    return BundleFile(
        path=f"hf/{repo}/{path}",
        kind="model",
        sha256=(path.encode().hex() * 64)[:64],
        size=size,
        origin=f"https://huggingface.co/{repo}/resolve/main/{path}",
        repo=repo,
        repo_path=path,
        hub_sha256=hub,
    )


HELD = MirrorHeld(
    files=[
        model("org/tiny-GGUF", "tiny-Q4_K_M.gguf", 40_000),
        model("org/old", "pytorch_model.bin", 30_000),
        model("org/old", "config.json", 20, hub=False),
        model("org/st", "model.safetensors", 50_000),
        BundleFile(
            path="llama.cpp/download/b4242/llama-b4242-bin-ubuntu-x64.tar.gz",
            kind="engine",
            sha256="a" * 64,
            size=4_000_000,
            origin="https://github.com/ggml-org/llama.cpp/releases/download/b4242/x",
            version="b4242",
            engine="llama.cpp",
        ),
    ],
    models=["hf:org/tiny-GGUF:Q4_K_M", "hf:org/old", "hf:org/st"],
)


@dataclass
class Desk:
    answer: MirrorHeld = field(default_factory=lambda: HELD)

    def held(self) -> MirrorHeld:
        return self.answer


@dataclass
class Asked:
    states: list[MirrorState] = field(default_factory=list)


async def client_of(
    desk: Desk | None, others: Asked | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    frame = Frame(Gate(lambda token: False, lambda: None, SESSIONS), lambda: None)
    pages = mirrorpages.pages(frame, desk, others)
    app = Starlette(routes=[Route(p.path, frame.endpoint(p), methods=[p.method]) for p in pages])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp") as c:
        yield c


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_of(Desk()):
        yield c


VIEWER = {"cookie": f"{COOKIE}={SESSIONS.open('v@test', 'viewer', 'h')}"}  # type: ignore[arg-type]


def text(page: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page))).strip()


def row(page: str, rid: str) -> str:
    found = re.search(rf'<tr id="{rid}"([^>]*)>(.*?)</tr>', page, re.S)
    assert found is not None, rid
    return found.group(1) + " " + text(found.group(2))


async def test_without_a_session_the_page_goes_to_sign_in(client: httpx.AsyncClient) -> None:
    answer = await client.get("/admin/mirror")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/admin/login?next=/admin/mirror"


async def test_each_repository_its_files_and_a_pickle_only_set_marked(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/admin/mirror", headers=VIEWER)
    assert answer.status_code == 200
    assert "default-src 'none'" in answer.headers["content-security-policy"]
    page = answer.text
    gguf = row(page, "mirror-org--tiny-GGUF")
    assert "pickle-only" not in gguf
    assert "hf:org/tiny-GGUF gguf 39.1 KiB tiny-Q4_K_M.gguf · 39.1 KiB" in gguf
    old = row(page, "mirror-org--old")
    assert 'class="pickle-only"' in old
    assert "Pickled weights only: llmgw refuses them unless the model allows pickles." in old
    assert "SFconvertbot pull request, revision refs/pr/N" in old
    assert "config.json · 20 B" in old and "(size checked; the hub lists no sha256)" in old
    st = row(page, "mirror-org--st")
    assert "safetensors" in st and "pickle-only" not in st and "Pickled" not in st
    said = text(page)
    assert "llama.cpp b4242 llama-b4242-bin-ubuntu-x64.tar.gz 3.8 MiB aaaaaaaaaaaa" in said
    assert "3.9 MiB in all" in said


async def test_a_mirror_off_or_empty_says_so() -> None:
    async for off in client_of(None):
        page = (await off.get("/admin/mirror", headers=VIEWER)).text
        assert "The mirror is off: set offline.mirror in server.yaml" in text(page)
    async for empty in client_of(Desk(MirrorHeld(files=[], models=[]))):
        page = (await empty.get("/admin/mirror", headers=VIEWER)).text
        assert "The mirror holds nothing yet" in text(page)


async def test_the_mirrors_on_nodes_whether_each_answered() -> None:
    asked = Asked(
        [
            MirrorState("http://n7:8090", "api", live=True, checked_at=time.time(), files=5),
            MirrorState(
                "http://n8:8090", "peer", live=False, checked_at=time.time(), error="refused"
            ),
            MirrorState("http://n9:8090", "peer"),
        ]
    )
    async for c in client_of(Desk(), asked):
        page = (await c.get("/admin/mirror", headers=VIEWER)).text
    assert row(page, "other-1").startswith(' class="live" http://n7:8090 first yes asked ')
    assert row(page, "other-1").endswith(" 5")
    assert row(page, "other-2").startswith(' class="away" http://n8:8090 peer no refused asked ')
    assert row(page, "other-3") == ' class="away" http://n9:8090 peer not asked yet —'
