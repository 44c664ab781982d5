"""Fixtures of the weights tests: the fake hub on loopback, a client, a store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from weights_fakehub import FakeHub, start_hub

from llmgw.agent.weights import HubClient, WeightStore


@pytest.fixture
async def hub() -> AsyncIterator[FakeHub]:
    fake, runner = await start_hub()
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(hub: FakeHub) -> AsyncIterator[HubClient]:
    # environ={} so a developer's own HF_TOKEN or HF_ENDPOINT never leaks into a test.
    c = HubClient(hub.endpoint, environ={})
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def store(cache: Path, client: HubClient) -> WeightStore:
    return WeightStore(cache, client, retries=0, chunk_size=16 * 1024, progress_interval=0)
