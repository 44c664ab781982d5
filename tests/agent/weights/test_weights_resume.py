"""Downloads that go wrong or are shared: resume with Range, a server ignoring Range,
a sha256 mismatch, no Content-Length, single flight, and progress pacing."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from weights_fakehub import FakeHub, Progress, Served, blob

from llmgw.agent.weights import (
    ChecksumError,
    HubClient,
    NetworkError,
    WeightStore,
    cache_name,
)

REPO = "org/tiny-GGUF"
SOURCE = f"hf:{REPO}:Q4_K_M"
FILE = "tiny-Q4_K_M.gguf"


def part_of(cache: Path, source: str, name: str) -> Path:
    return cache / cache_name(source) / f"{name}.part"


async def test_an_interrupted_download_resumes_from_the_part_with_range(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    served = hub.add(REPO, FILE, blob(200_000, 7), cut_after=70_000, cuts=1)
    first = Progress()
    with pytest.raises(NetworkError, match="cut"):
        await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=first)
    assert first.last.error is not None and not first.last.finished
    part = part_of(cache, SOURCE, FILE)
    # Every byte received before the cut is kept, and nothing took the final name.
    assert part.stat().st_size == 70_000
    assert not (cache / cache_name(SOURCE) / FILE).exists()

    second = Progress()
    path = await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=second)
    first_get, resumed = hub.downloads()
    assert "Range" not in first_get.headers
    assert resumed.headers["Range"] == "bytes=70000-"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == served.sha256
    assert second.reports[0].done == 70_000  # resumed bytes count from the start
    assert second.last.finished and second.last.done == 200_000


async def test_a_cut_is_retried_within_one_fetch_from_where_it_stopped(
    hub: FakeHub, client: HubClient, cache: Path
) -> None:
    served = hub.add(REPO, FILE, blob(120_000, 8), cut_after=50_000, cuts=2)
    store = WeightStore(cache, client, retries=2, retry_delay=0.01, chunk_size=16 * 1024)
    path = await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=Progress())
    assert path.read_bytes() == served.content
    ranges = [d.headers.get("Range") for d in hub.downloads()]
    assert ranges == [None, "bytes=50000-", "bytes=50000-"]


async def test_a_server_answering_a_range_with_200_means_starting_over(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    served = hub.add(REPO, FILE, blob(90_000, 9), cut_after=40_000, cuts=1)
    with pytest.raises(NetworkError):
        await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=Progress())
    served.ignore_range = True
    path = await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=Progress())
    assert hub.downloads()[-1].headers["Range"] == "bytes=40000-"
    assert path.read_bytes() == served.content  # not the first 40 000 bytes twice


async def test_a_part_as_long_as_the_file_is_verified_without_a_download(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    served = hub.add(REPO, FILE, blob(30_000, 10))
    part = part_of(cache, SOURCE, FILE)
    part.parent.mkdir(parents=True)
    part.write_bytes(served.content)
    path = await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=Progress())
    assert path.read_bytes() == served.content and hub.downloads() == []


async def test_a_sha256_mismatch_deletes_the_part_and_names_both_sums(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    wrong = "ab" * 32
    served = hub.add(REPO, FILE, blob(50_000, 11), published_sha=wrong)
    progress = Progress()
    with pytest.raises(ChecksumError) as info:
        await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=progress)
    assert f"expected {wrong}, got {served.sha256}" in str(info.value)
    directory = cache / cache_name(SOURCE)
    assert not (directory / FILE).exists() and not part_of(cache, SOURCE, FILE).exists()
    assert not (directory / ".llmgw-complete.json").exists()
    assert progress.last.error is not None and "sha256 mismatch" in progress.last.error


async def test_without_content_length_progress_has_no_total(
    hub: FakeHub, store: WeightStore
) -> None:
    served = hub.urls["tiny.gguf"] = Served(blob(150_000, 12), no_length=True)
    progress = Progress()
    path = await store.fetch(
        f"{hub.endpoint}/files/tiny.gguf", allow_pickle=False, replica_id="r", progress=progress
    )
    assert path.read_bytes() == served.content and path.name == "tiny.gguf"
    assert len(progress.reports) > 2
    assert all(r.total is None for r in progress.reports)
    dones = [r.done for r in progress.reports]
    assert dones == sorted(dones) and progress.last.done == 150_000 and progress.last.finished


async def test_a_url_with_a_length_reports_its_total_and_resumes(
    hub: FakeHub, store: WeightStore
) -> None:
    served = hub.urls["m.gguf"] = Served(blob(80_000, 13), cut_after=30_000, cuts=1)
    url = f"{hub.endpoint}/files/m.gguf"
    with pytest.raises(NetworkError):
        await store.fetch(url, allow_pickle=False, replica_id="r", progress=Progress())
    progress = Progress()
    path = await store.fetch(url, allow_pickle=False, replica_id="r", progress=progress)
    assert path.read_bytes() == served.content
    assert hub.downloads()[-1].headers["Range"] == "bytes=30000-"
    assert progress.last.total == 80_000 and progress.last.done == 80_000


async def test_concurrent_fetches_of_one_source_make_one_download(
    hub: FakeHub, store: WeightStore
) -> None:
    gate = asyncio.Event()
    served = hub.add(REPO, FILE, blob(100_000, 14), hold=gate)
    progress = Progress()  # one sender shared by every shard, as the agent's stream is
    other = Progress()
    first = asyncio.create_task(
        store.fetch(SOURCE, allow_pickle=False, replica_id="a", progress=progress)
    )
    await asyncio.wait_for(_until(lambda: bool(hub.downloads())), 10)
    # Later shards join the download already under way.
    rest = [
        asyncio.create_task(
            store.fetch(SOURCE.lower(), allow_pickle=False, replica_id=r, progress=p)
        )
        for r, p in (("b", progress), ("c", other))
    ]
    await asyncio.sleep(0)
    gate.set()
    paths = await asyncio.gather(first, *rest)
    assert len(set(paths)) == 1 and paths[0].read_bytes() == served.content
    assert len(hub.downloads()) == 1 and len(hub.listings()) == 1
    assert progress.last.finished and progress.last.replica_ids == ["a", "b", "c"]
    # The shared sender got each report once, not once a shard.
    assert [r for r in progress.reports if "c" in r.replica_ids] == other.reports
    assert store.in_flight() == frozenset()


async def test_a_caller_giving_up_does_not_stop_the_others(
    hub: FakeHub, store: WeightStore
) -> None:
    gate = asyncio.Event()
    hub.add(REPO, FILE, blob(60_000, 15), hold=gate)
    leaving = asyncio.create_task(
        store.fetch(SOURCE, allow_pickle=False, replica_id="a", progress=Progress())
    )
    staying = asyncio.create_task(
        store.fetch(SOURCE, allow_pickle=False, replica_id="b", progress=Progress())
    )
    await asyncio.wait_for(_until(lambda: bool(hub.downloads())), 10)
    leaving.cancel()
    gate.set()
    assert (await staying).stat().st_size == 60_000
    with pytest.raises(asyncio.CancelledError):
        await leaving


async def test_progress_is_paced_with_a_final_report(
    hub: FakeHub, client: HubClient, cache: Path
) -> None:
    hub.add(REPO, FILE, blob(200_000, 16))
    now = [0.0]

    def clock() -> float:
        now[0] += 0.25  # four ticks a second of this clock
        return now[0]

    store = WeightStore(cache, client, chunk_size=8192, progress_interval=1.0, clock=clock)
    progress = Progress()
    await store.fetch(SOURCE, allow_pickle=False, replica_id="r", progress=progress)
    ticks = 200_000 // 8192
    assert 2 <= len(progress.reports) <= ticks // 4 + 3
    assert [r.finished for r in progress.reports].count(True) == 1 and progress.last.finished
    assert all(r.total == 200_000 for r in progress.reports)


async def _until(check: object) -> None:
    assert callable(check)
    while not check():
        await asyncio.sleep(0.005)


async def test_a_url_file_left_unmarked_is_checked_with_the_server_not_fetched_again(
    hub: FakeHub, store: WeightStore, cache: Path
) -> None:
    # A crash between a file's rename and the complete marker: its size is not known
    # without asking, so the server is asked from its end and answers 416.
    served = hub.urls["m.gguf"] = Served(blob(40_000, 17))
    url = f"{hub.endpoint}/files/m.gguf"
    path = await store.fetch(url, allow_pickle=False, replica_id="r", progress=Progress())
    (path.parent / ".llmgw-complete.json").unlink()
    again = await store.fetch(url, allow_pickle=False, replica_id="r", progress=Progress())
    assert again == path and path.read_bytes() == served.content
    assert hub.downloads()[-1].headers["Range"] == "bytes=40000-"
    assert (path.parent / ".llmgw-complete.json").exists()
