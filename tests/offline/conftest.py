"""The offline tests' sources: a signed llmgw release, a llama.cpp release source and a
hub with a GGUF repository and a safetensors one, all on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import RawTestServer

from llmgw.offline.bundle import create
from llmgw.offline.bundleimport import import_bundle
from llmgw.offline.mirrorfiles import MirrorFiles
from tests.agent.weights.weights_fakehub import FakeHub, blob, start_hub
from tests.support.bundles import GGUF, Sources, bundle_sources, plan


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[Sources]:
    with bundle_sources(tmp_path / "sources") as found:
        yield found


@pytest.fixture
async def hub() -> AsyncIterator[FakeHub]:
    fake, runner = await start_hub()
    fake.add("org/tiny-GGUF", GGUF, blob(40_000, 1))
    fake.add("org/tiny-GGUF", "README.md", b"# tiny\n", lfs=False)
    fake.add("org/tiny-st", "model.safetensors", blob(30_000, 2))
    fake.add("org/tiny-st", "config.json", b'{"model_type": "llama"}\n', lfs=False)
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
async def mirror(sources: Sources, hub: FakeHub, tmp_path: Path) -> MirrorFiles:
    made = await create(plan(sources, hub.endpoint, tmp_path / "bundle"))
    import_bundle(made.path, tmp_path / "data" / "mirror", keys=sources.keys)
    return MirrorFiles(tmp_path / "data" / "mirror")


@pytest.fixture
async def base(mirror: MirrorFiles) -> AsyncIterator[str]:
    server = RawTestServer(mirror.handle, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()
