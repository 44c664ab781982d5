"""The control plane's mirror over HTTP, read by the clients the agents and ``node add``
use: the hub client and weights cache, llama.cpp's checksum file, and llmgw's release
fetch. Only what the index lists is served."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from llmgw import release
from llmgw.agent.weights.fetch import WeightStore
from llmgw.modelkit.hub import HubClient, HubNotFound
from llmgw.offline.mirrorfiles import MirrorFiles, mirror_urls
from llmgw.server.mirror import offline_defaults, with_mirror_digests
from llmgw.wire.messages import WantedEngines
from tests.agent.weights.weights_fakehub import FakeHub
from tests.support.bundles import ENGINE_TAG, GGUF, VERSION, Sources


async def test_the_weights_cache_fetches_from_the_mirror_checked(
    hub: FakeHub, base: str, tmp_path: Path
) -> None:
    urls = mirror_urls(base)
    asked = len(hub.requests)  # the bundle's making asked the hub; nothing after it does
    async with HubClient(urls["hf_endpoint"], environ={}) as client:
        store = WeightStore(tmp_path / "cache", client, retries=0)
        entry = await store.fetch(
            f"hf:org/tiny-GGUF:{GGUF}", allow_pickle=False, replica_id="r1", progress=lambda _: None
        )
        assert entry.read_bytes() == hub.repos["org/tiny-GGUF"][GGUF].content
        folder = await store.fetch(
            "hf:org/tiny-st", allow_pickle=False, replica_id="r2", progress=lambda _: None
        )
        assert (folder / "config.json").read_bytes() == b'{"model_type": "llama"}\n'
        listing = await client.list_files("org/tiny-st")
        # Every file comes with a sha256, the small ones too: the agent checks each.
        assert all(f.sha256 for f in listing)
        with pytest.raises(HubNotFound):
            await client.list_files("org/not-bundled")
    assert len(hub.requests) == asked


async def test_engine_archives_and_llmgw_come_from_the_mirror(
    sources: Sources, mirror: MirrorFiles, base: str, tmp_path: Path
) -> None:
    urls = mirror_urls(base)
    asset = sources.engine_asset
    published = (sources.engines.root / "download" / ENGINE_TAG / asset).read_bytes()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{urls['release_source']}/download/{ENGINE_TAG}/{asset}") as r:
            assert r.status == 200 and await r.read() == published
        async with http.get(f"{urls['release_source']}/download/{ENGINE_TAG}/{asset}.sha256") as r:
            digest = (await r.text()).split()[0]
        # Only what the index lists: not a file left beside it, a folder, or a climb.
        (mirror.root / "llmgw" / "planted.pyz").write_bytes(b"not imported")
        for hidden in ("llmgw/planted.pyz", "hf/org/tiny-st", "llmgw/%2e%2e/index.json"):
            # encoded=True: sent as written, not tidied by the client first.
            async with http.get(URL(f"{base}/mirror/{hidden}", encoded=True)) as r:
                assert r.status == 404, hidden
        async with http.get(f"{base}/mirror/index.json") as r:
            listed = {f["path"] for f in (await r.json())["files"]}
            assert f"llama.cpp/download/{ENGINE_TAG}/{asset}" in listed
        async with http.post(f"{urls['release_source']}/download/{ENGINE_TAG}/{asset}") as r:
            assert r.status == 405
    wanted = WantedEngines(version=1, engines={"llama.cpp": {"version": ENGINE_TAG, "sha256": {}}})
    assert with_mirror_digests(wanted, mirror).engines["llama.cpp"]["sha256"] == {asset: digest}

    fetched = await asyncio.to_thread(
        release.fetch, urls["llmgw_source"], VERSION, tmp_path / "bin", keys=sources.keys
    )
    assert fetched.path.read_bytes() == (tmp_path / "sources" / "tiny.pyz").read_bytes()


async def test_the_mirror_vouches_for_what_it_holds_of_a_source(
    hub: FakeHub, mirror: MirrorFiles
) -> None:
    gguf = hub.repos["org/tiny-GGUF"][GGUF]
    assert mirror.digests_of(f"hf:org/tiny-GGUF:{GGUF}") == {GGUF: gguf.sha256}
    held = hub.repos["org/tiny-st"]
    assert mirror.digests_of("hf:org/tiny-st") == {p: held[p].sha256 for p in held}
    assert mirror.digests_of("hf:ORG/TINY-gguf") == mirror.digests_of("hf:org/tiny-GGUF")
    assert mirror.digests_of("hf:org/elsewhere") == {}
    assert mirror.digests_of("https://example.com/x.gguf") == {}
    assert mirror.digests_of("not a source") == {}


def test_an_operators_setting_stays_over_the_mirrors() -> None:
    mine = offline_defaults({"hf_endpoint": "http://hub.internal"}, "http://10.0.0.1:8080")
    assert mine == {
        "release_source": "http://10.0.0.1:8080/mirror/llama.cpp",
        "hf_endpoint": "http://hub.internal",
    }


def test_an_empty_mirror_serves_nothing(tmp_path: Path) -> None:
    files = MirrorFiles(tmp_path / "mirror")
    assert files.held().files == [] and files.file("llmgw/download/v1.0.0/x") is None
