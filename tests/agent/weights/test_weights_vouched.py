"""The sha256 the control plane vouches for (its mirror's, sent in the shard spec) is
believed over the hub's listing: a file unlike it is refused, fetched or already held."""

from __future__ import annotations

from pathlib import Path

import pytest
from weights_fakehub import FakeHub, Progress, blob

from llmgw.agent.weights import HubClient, WeightStore
from llmgw.agent.weights.errors import ChecksumError
from tests.support.ports import free_port

REPO = "org/tiny-GGUF"
SOURCE = f"hf:{REPO}:tiny-Q4_K_M.gguf"


async def test_a_file_unlike_the_vouched_sha256_is_refused(
    hub: FakeHub, store: WeightStore
) -> None:
    # The hub (a mirror someone changed) lists the changed file's own sha256.
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(20_000, 1))
    vouched = {"tiny-Q4_K_M.gguf": "e" * 64}
    with pytest.raises(ChecksumError, match=f"expected {'e' * 64}"):
        await store.fetch(
            SOURCE, allow_pickle=False, replica_id="r1", progress=Progress(), vouched=vouched
        )
    assert not list(store.cache_dir.rglob("tiny-Q4_K_M.gguf"))


async def test_a_file_as_vouched_is_fetched_and_a_held_one_checked_again(
    hub: FakeHub, store: WeightStore
) -> None:
    served = hub.add(REPO, "tiny-Q4_K_M.gguf", blob(20_000, 1))
    right = {"tiny-Q4_K_M.gguf": served.sha256}
    path = await store.fetch(
        SOURCE, allow_pickle=False, replica_id="r1", progress=Progress(), vouched=right
    )
    assert path.read_bytes() == served.content
    # Held already, under a control plane that vouches for other bytes: refused, kept.
    with pytest.raises(ChecksumError, match="the control plane vouches for"):
        await store.fetch(
            SOURCE,
            allow_pickle=False,
            replica_id="r2",
            progress=Progress(),
            vouched={"tiny-Q4_K_M.gguf": "f" * 64},
        )
    assert path.read_bytes() == served.content


async def test_a_shard_is_fetched_from_the_mirror_the_control_plane_named(
    hub: FakeHub, cache: Path
) -> None:
    served = hub.add(REPO, "tiny-Q4_K_M.gguf", blob(20_000, 1))
    # The node's own hub answers nothing; the named mirror (here the fake hub) does.
    own = HubClient(f"http://127.0.0.1:{free_port()}", environ={})
    store = WeightStore(cache, own, retries=0)
    try:
        path = await store.fetch(
            SOURCE,
            allow_pickle=False,
            replica_id="r1",
            progress=Progress(),
            vouched={"tiny-Q4_K_M.gguf": served.sha256},
            hub=hub.endpoint,
        )
    finally:
        await store.close()
        await own.close()
    assert path.read_bytes() == served.content
    assert [d.path for d in hub.downloads()] == [f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf"]
