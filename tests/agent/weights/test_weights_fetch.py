"""Fetching against a hub on loopback: what lands where, the hub's errors, pickles,
disk, tokens, local paths, and a second fetch after a restart costing nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from weights_fakehub import TOKEN, FakeHub, Progress, blob

from llmgw.agent.weights import (
    DiskSpaceError,
    HubAuthError,
    HubClient,
    HubNotFound,
    NetworkError,
    PickleRefused,
    SourceError,
    WeightStore,
    cache_name,
)

REPO = "org/tiny-GGUF"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_quantisation_is_fetched_verified_and_marked_complete(
    hub: FakeHub, store: WeightStore, cache: Path, client: HubClient
) -> None:
    q4 = hub.add(REPO, "tiny-Q4_K_M.gguf", blob(100_000, 1))
    hub.add(REPO, "tiny-Q8_0.gguf", blob(50_000, 2))
    progress = Progress()
    path = await store.fetch(
        f"hf:{REPO}:Q4_K_M", allow_pickle=False, replica_id="r1", progress=progress
    )
    name = cache_name(f"hf:{REPO}:Q4_K_M")
    assert path == cache / name / "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == q4.content
    assert [d.path for d in hub.downloads()] == [f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf"]
    # Offsets must be the file's own bytes: nothing compressed in transit.
    assert {r.headers["Accept-Encoding"] for r in hub.requests} == {"identity"}
    assert not list((cache / name).glob("*.part"))
    marker = json.loads((cache / name / ".llmgw-complete.json").read_text())
    assert marker["source"] == f"hf:{REPO.lower()}:Q4_K_M"
    assert marker["files"] == [
        {"path": "tiny-Q4_K_M.gguf", "size": 100_000, "sha256": q4.sha256, "verified": True}
    ]
    assert progress.last.finished and progress.last.done == progress.last.total == 100_000
    assert progress.last.replica_ids == ["r1"] and progress.last.error is None
    assert all(r.source == f"hf:{REPO}:Q4_K_M" for r in progress.reports)

    # A restarted agent (a new store) finds it whole and asks the hub nothing.
    before = len(hub.requests)
    again = WeightStore(cache, client)
    quiet = Progress()
    assert (
        await again.fetch(f"hf:{REPO}:q4_k_m", allow_pickle=False, replica_id="r2", progress=quiet)
        == path
    )
    assert len(hub.requests) == before and quiet.reports == []


async def test_a_file_removed_by_hand_is_fetched_again(hub: FakeHub, store: WeightStore) -> None:
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(20_000, 1))
    source = f"hf:{REPO}:Q4_K_M"
    path = await store.fetch(source, allow_pickle=False, replica_id="r", progress=Progress())
    path.unlink()
    assert (
        await store.fetch(source, allow_pickle=False, replica_id="r", progress=Progress()) == path
    )
    assert path.stat().st_size == 20_000 and len(hub.downloads()) == 2


async def test_a_split_gguf_returns_its_first_part_with_all_parts_beside_it(
    hub: FakeHub, store: WeightStore
) -> None:
    parts = [
        hub.add(REPO, f"Q4_K_M/t-Q4_K_M-0000{n}-of-00003.gguf", blob(30_000, n)) for n in (1, 2, 3)
    ]
    hub.add(REPO, "t-Q8_0.gguf", blob(10, 9))
    hub.page_size = 2  # the listing comes in pages
    progress = Progress()
    path = await store.fetch(
        f"hf:{REPO}:Q4_K_M", allow_pickle=False, replica_id="r", progress=progress
    )
    assert path.name == "t-Q4_K_M-00001-of-00003.gguf" and path.parent.name == "Q4_K_M"
    for n, served in zip((1, 2, 3), parts, strict=True):
        assert (path.parent / f"t-Q4_K_M-0000{n}-of-00003.gguf").read_bytes() == served.content
    assert len(hub.listings()) > 1
    assert progress.last.finished and progress.last.done == progress.last.total == 90_000


async def test_a_whole_repository_is_a_directory_of_safetensors_without_its_pickles(
    hub: FakeHub, store: WeightStore
) -> None:
    hub.add("org/st", "config.json", b'{"a": 1}', lfs=False)
    hub.add("org/st", "model.safetensors", blob(40_000, 3))
    hub.add("org/st", "training_args.bin", blob(100, 4))
    path = await store.fetch("hf:org/st", allow_pickle=False, replica_id="r", progress=Progress())
    assert path.is_dir() and path.name == cache_name("hf:org/st")
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "model.safetensors",
    ]
    assert hub.downloads("training_args") == []


async def test_a_gated_repository_without_a_token_says_to_set_hf_token(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    hub.add("org/gated", "m-Q4_K_M.gguf", blob(1000))
    hub.gated.add("org/gated")
    with pytest.raises(HubAuthError) as info:
        await store.fetch(
            "hf:org/gated:Q4_K_M", allow_pickle=False, replica_id="r", progress=Progress()
        )
    assert "401" in str(info.value) and "set HF_TOKEN" in str(info.value)
    assert hub.downloads() == []
    async with HubClient(hub.endpoint, environ={"HF_TOKEN": TOKEN}) as with_token:
        path = await WeightStore(cache, with_token).fetch(
            "hf:org/gated:Q4_K_M", allow_pickle=False, replica_id="r", progress=Progress()
        )
    assert path.stat().st_size == 1000
    assert hub.downloads()[-1].headers["Authorization"] == f"Bearer {TOKEN}"


async def test_the_token_never_follows_a_redirect_to_another_origin(
    hub: FakeHub, cache: Path
) -> None:
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(5000))
    # Another origin of the same server: "localhost" is not "127.0.0.1".
    hub.cdn = hub.endpoint.replace("127.0.0.1", "localhost")
    async with HubClient(hub.endpoint, TOKEN, environ={}) as client:
        path = await WeightStore(cache, client).fetch(
            f"hf:{REPO}:Q4_K_M", allow_pickle=False, replica_id="r", progress=Progress()
        )
    assert path.stat().st_size == 5000
    resolve, cdn = hub.downloads()
    assert resolve.headers.get("Authorization") == f"Bearer {TOKEN}"
    assert cdn.path.startswith("/cdn/") and "Authorization" not in cdn.headers


async def test_a_missing_repository_and_a_missing_file_are_named(
    hub: FakeHub, store: WeightStore
) -> None:
    with pytest.raises(HubNotFound, match="hf:org/nothing: repository not found"):
        await store.fetch("hf:org/nothing", allow_pickle=False, replica_id="r", progress=Progress())
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(10))
    with pytest.raises(HubNotFound, match="no file 'other.gguf'"):
        await store.fetch(
            f"hf:{REPO}:other.gguf", allow_pickle=False, replica_id="r", progress=Progress()
        )
    with pytest.raises(HubNotFound, match="not found"):
        await store.fetch(
            f"{hub.endpoint}/files/absent.gguf",
            allow_pickle=False,
            replica_id="r",
            progress=Progress(),
        )


async def test_an_unreachable_hub_is_named(cache: Path) -> None:
    async with HubClient("http://127.0.0.1:9", environ={}) as client:
        with pytest.raises(NetworkError, match=r"cannot reach 127\.0\.0\.1:9"):
            await WeightStore(cache, client).fetch(
                "hf:org/repo:Q4_K_M", allow_pickle=False, replica_id="r", progress=Progress()
            )


@pytest.mark.parametrize(
    "source",
    ["hf:org/pickles:pytorch_model.bin", "hf:org/pickles:nested/model.pt2", "URL/files/m.pt?x=1"],
)
async def test_a_pickled_file_is_refused_before_any_request(
    hub: FakeHub, store: WeightStore, cache: Path, source: str
) -> None:
    source = source.replace("URL", hub.endpoint)
    with pytest.raises(PickleRefused) as info:
        await store.fetch(source, allow_pickle=False, replica_id="r", progress=Progress())
    assert "allow_pickle: true" in str(info.value)
    assert hub.requests == [] and not cache.exists()


async def test_a_repository_of_only_pickles_is_refused_after_its_listing_alone(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    hub.add("org/pickles", "config.json", b"{}")
    hub.add("org/pickles", "pytorch_model.bin", blob(3000, 5))
    with pytest.raises(PickleRefused, match="pytorch_model.bin"):
        await store.fetch("hf:org/pickles", allow_pickle=False, replica_id="r", progress=Progress())
    assert len(hub.listings()) == 1 and hub.downloads() == []
    assert not (cache / cache_name("hf:org/pickles")).exists()

    path = await store.fetch(
        "hf:org/pickles", allow_pickle=True, replica_id="r", progress=Progress()
    )
    assert (path / "pytorch_model.bin").stat().st_size == 3000
    # Already on the node is no pass: a model that does not allow pickles is refused.
    with pytest.raises(PickleRefused):
        await store.fetch(
            "hf:org/pickles", allow_pickle=False, replica_id="r2", progress=Progress()
        )


async def test_not_enough_disk_fails_with_the_figures_before_fetching(
    hub: FakeHub, client: HubClient, cache: Path
) -> None:
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(100_000))
    asked: list[Path] = []

    def tiny_disk(path: Path) -> SimpleNamespace:
        asked.append(path)
        return SimpleNamespace(total=10**9, used=10**9 - 4096, free=4096)

    store = WeightStore(cache, client, disk_usage=tiny_disk)
    with pytest.raises(DiskSpaceError) as info:
        await store.fetch(
            f"hf:{REPO}:Q4_K_M", allow_pickle=False, replica_id="r", progress=Progress()
        )
    message = str(info.value)
    assert "100000 bytes" in message and "(4096 bytes) free" in message and str(cache) in message
    assert asked == [cache] and hub.downloads() == []


async def test_a_local_path_is_used_in_place(
    tmp_path: Path, store: WeightStore, hub: FakeHub
) -> None:
    model = tmp_path / "models" / "tiny.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    assert (
        await store.fetch(str(model), allow_pickle=False, replica_id="r", progress=Progress())
        == model
    )
    assert hub.requests == [] and not store.cache_dir.exists()
    with pytest.raises(SourceError, match="no such file"):
        await store.fetch(
            str(tmp_path / "absent.gguf"), allow_pickle=False, replica_id="r", progress=Progress()
        )


async def test_a_local_directory_of_only_pickles_is_refused(
    tmp_path: Path, store: WeightStore
) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "pytorch_model.bin").write_bytes(b"x")
    (directory / "config.json").write_text("{}")
    with pytest.raises(PickleRefused, match="pytorch_model.bin"):
        await store.fetch(str(directory), allow_pickle=False, replica_id="r", progress=Progress())
    assert (
        await store.fetch(str(directory), allow_pickle=True, replica_id="r", progress=Progress())
        == directory
    )
    (directory / "model.safetensors").write_bytes(b"x")
    assert (
        await store.fetch(str(directory), allow_pickle=False, replica_id="r", progress=Progress())
        == directory
    )
    # A link named like GGUF leading to a pickle is still a pickle.
    link = tmp_path / "model.gguf"
    link.symlink_to(directory / "pytorch_model.bin")
    with pytest.raises(PickleRefused):
        await store.fetch(str(link), allow_pickle=False, replica_id="r", progress=Progress())


async def test_plain_http_off_loopback_is_refused_before_any_request(store: WeightStore) -> None:
    with pytest.raises(SourceError, match="plain http:// is refused"):
        await store.fetch(
            "http://mirror.example/x.gguf", allow_pickle=False, replica_id="r", progress=Progress()
        )


def test_the_endpoint_and_token_come_from_config_then_the_environment() -> None:
    env = {"HF_ENDPOINT": "https://mirror.example/hf/", "HF_TOKEN": "hf_env"}
    from_env = HubClient(environ=env)
    assert str(from_env.endpoint) == "https://mirror.example/hf" and from_env.has_token
    assert from_env.resolve_url("o/r", "a b/c.gguf") == (
        "https://mirror.example/hf/o/r/resolve/main/a%20b/c.gguf"
    )
    chosen = HubClient("http://10.0.0.1:8080", None, environ=env)
    assert str(chosen.endpoint) == "http://10.0.0.1:8080"
    assert str(HubClient(environ={}).endpoint) == "https://huggingface.co"
    assert not HubClient(environ={}).has_token
