"""Listing the cache, and collecting: the node removes only what it can prove it fetched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from weights_fakehub import FakeHub, Progress, blob

from llmgw.agent.weights import Inventory, NetworkError, WeightStore, cache_name

REPO = "org/tiny-GGUF"
SOURCE = f"hf:{REPO}:Q4_K_M"


async def fetched(hub: FakeHub, store: WeightStore, source: str = SOURCE) -> Path:
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(40_000, 1))
    hub.add(REPO, "tiny-Q8_0.gguf", blob(30_000, 2))
    return await store.fetch(source, allow_pickle=False, replica_id="r", progress=Progress())


async def test_the_listing_names_sources_files_sizes_and_completeness(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    await fetched(hub, store)
    hub.repos[REPO]["tiny-Q8_0.gguf"].cut_after = 10_000
    hub.repos[REPO]["tiny-Q8_0.gguf"].cuts = 1
    with pytest.raises(NetworkError):
        await store.fetch(
            f"hf:{REPO}:Q8_0", allow_pickle=False, replica_id="r", progress=Progress()
        )
    (cache / "operator-copy").mkdir()  # not ours: not listed
    listed = {s.name: s for s in await store.list_cache()}
    whole = listed[cache_name(SOURCE)]
    assert whole.complete and whole.source == f"hf:{REPO.lower()}:Q4_K_M"
    assert [(f.path, f.size, f.partial) for f in whole.files] == [
        ("tiny-Q4_K_M.gguf", 40_000, False)
    ]
    assert whole.total_bytes == 40_000 and whole.path == str(cache / whole.name)
    partial = listed[cache_name(f"hf:{REPO}:Q8_0")]
    assert not partial.complete and partial.source == f"hf:{REPO.lower()}:Q8_0"
    assert [(f.path, f.size, f.partial) for f in partial.files] == [
        ("tiny-Q8_0.gguf.part", 10_000, True)
    ]
    assert len(listed) == 2


async def test_an_empty_or_absent_cache_lists_nothing(tmp_path: Path) -> None:
    assert await Inventory(tmp_path / "absent").list_cache() == []


async def test_collect_removes_a_source_directory_whole_and_counts_what_it_freed(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    path = await fetched(hub, store)
    name = cache_name(SOURCE)
    (path.parent / "sub").mkdir()
    (path.parent / "sub" / "extra.json").write_bytes(b"x" * 100)
    markers = sum(p.stat().st_size for p in path.parent.glob(".llmgw-*"))
    result = await store.collect([str(cache / name), name])  # one directory, asked twice
    assert result.removed == [str(cache / name)]
    assert result.kept == [(name, "no such path")]
    assert result.freed_bytes == 40_000 + 100 + markers
    assert not (cache / name).exists()
    assert await store.list_cache() == []


async def test_collect_refuses_what_it_cannot_prove_it_fetched(
    hub: FakeHub, store: WeightStore, cache: Path, tmp_path: Path
) -> None:
    path = await fetched(hub, store)
    name = cache_name(SOURCE)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "model.gguf").write_bytes(b"a week to copy")
    outside_ours = tmp_path / name  # our name, but not in the cache
    outside_ours.mkdir()
    (cache / "operator-copy").mkdir()
    (cache / "operator-copy" / "m.gguf").write_bytes(b"scp'd by hand")
    (cache / "leads-out").symlink_to(tmp_path)
    impostor = cache / "hf--org--other--0123456789abcdef"
    impostor.mkdir()
    (impostor / ".llmgw-source.json").write_text('{"source": "hf:org/something-else"}')
    stray = cache / "url--h--f.gguf--0123456789abcdef"
    stray.write_bytes(b"a file, not a source directory")

    asked = [
        f"../{outside.name}",
        f"{name}/../../precious",
        str(outside),
        str(outside_ours),
        "operator-copy",
        str(cache / "operator-copy"),
        f"{name}/tiny-Q4_K_M.gguf",
        f"leads-out/{name}",
        str(cache),
        impostor.name,
        stray.name,
        "",
    ]
    result = await store.collect(asked)
    assert result.removed == [] and result.freed_bytes == 0
    reasons = dict(result.kept)
    assert list(reasons) == asked
    assert "'..'" in reasons[f"../{outside.name}"]
    assert "'..'" in reasons[f"{name}/../../precious"]
    assert "directly inside the cache" in reasons[str(outside)]
    assert "directly inside the cache" in reasons[str(outside_ours)]
    assert "cache name" in reasons["operator-copy"]
    assert "cache name" in reasons[str(cache / "operator-copy")]
    assert "directly inside the cache" in reasons[f"{name}/tiny-Q4_K_M.gguf"]
    assert "directly inside the cache" in reasons[f"leads-out/{name}"]
    assert "directly inside the cache" in reasons[str(cache)]
    assert "marker names another source" in reasons[impostor.name]
    assert "not a directory" in reasons[stray.name]
    assert reasons[""] == "not a path"
    # Everything is where it was.
    assert (outside / "model.gguf").read_bytes() == b"a week to copy"
    assert outside_ours.is_dir() and impostor.is_dir() and stray.is_file()
    assert (cache / "operator-copy" / "m.gguf").exists() and path.exists()


async def test_a_link_with_our_name_is_removed_as_a_link_never_followed(
    store: WeightStore, cache: Path, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "model.gguf").write_bytes(b"keep me")
    cache.mkdir()
    link = cache / "hf--org--linked--0123456789abcdef"
    link.symlink_to(target)
    other_link = cache / "not-ours-link"
    other_link.symlink_to(target)
    result = await store.collect([link.name, other_link.name])
    assert result.removed == [link.name] and result.freed_bytes == 0
    assert [k for k, _ in result.kept] == [other_link.name]
    assert not link.is_symlink() and not link.exists()
    assert (target / "model.gguf").read_bytes() == b"keep me"
    assert other_link.is_symlink()


async def test_a_link_inside_a_source_is_unlinked_with_it_not_followed(
    hub: FakeHub, store: WeightStore, cache: Path, tmp_path: Path
) -> None:
    path = await fetched(hub, store)
    target = tmp_path / "precious.gguf"
    target.write_bytes(b"keep me")
    (path.parent / "planted").symlink_to(target)
    result = await store.collect([cache_name(SOURCE)])
    assert result.removed == [cache_name(SOURCE)]
    assert target.read_bytes() == b"keep me"


async def test_a_source_being_fetched_is_kept(hub: FakeHub, store: WeightStore) -> None:
    gate = asyncio.Event()
    hub.add(REPO, "tiny-Q4_K_M.gguf", blob(40_000, 1), hold=gate)
    task = asyncio.create_task(
        store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=Progress())
    )
    while not hub.downloads():
        await asyncio.sleep(0.005)
    result = await store.collect([cache_name(SOURCE)])
    assert result.removed == [] and "being fetched" in result.kept[0][1]
    gate.set()
    assert (await task).exists()


async def test_a_fetch_after_a_collection_fetches_again(hub: FakeHub, store: WeightStore) -> None:
    path = await fetched(hub, store)
    await store.collect([cache_name(SOURCE)])
    again = await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=Progress())
    assert again == path and path.stat().st_size == 40_000
    assert len(hub.downloads()) == 2


async def test_a_directory_with_our_name_but_no_marker_is_ours_by_name(cache: Path) -> None:
    # A fetch that stopped between making its directory and marking it.
    bare = cache / "hf--org--repo--0123456789abcdef"
    bare.mkdir(parents=True)
    (bare / "x.gguf.part").write_bytes(b"12345")
    result = await Inventory(cache).collect([bare.name])
    assert result.removed == [bare.name] and result.freed_bytes == 5 and not bare.exists()


async def test_a_cache_dir_configured_through_a_link_works_and_other_aliases_do_not(
    hub: FakeHub, tmp_path: Path, store: WeightStore
) -> None:
    path = await fetched(hub, store)
    alias = tmp_path / "alias"
    alias.symlink_to(store.cache_dir)
    through_alias = str(alias / cache_name(SOURCE))
    # The node's own cache is named by its configured path (or its real one) only.
    result = await store.collect([through_alias])
    assert result.removed == [] and path.exists()
    result = await Inventory(alias).collect([through_alias])
    assert result.removed == [through_alias] and not path.exists()
