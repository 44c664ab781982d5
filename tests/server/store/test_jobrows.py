"""The serve jobs' table (migration 0013) on both backends: a job written, rewritten as
it moves, read back whole; the running ones found for a new leader; and the table kept
to the newest ``KEEP`` jobs, none older than ``KEEP_SECONDS``."""

from __future__ import annotations

from dataclasses import replace

from llmgw.server.store import Store
from llmgw.server.store.jobrows import KEEP, KEEP_SECONDS, JobRecord

NOW = 1.7e9
BODY = {"id": "job-0123456789ab", "steps": [{"name": "resolve", "detail": "h\u00e9"}]}


async def test_a_job_is_written_rewritten_and_read_back_whole(store: Store) -> None:
    job = JobRecord("job-0123456789ab", "serve", "m", "running", BODY, NOW, NOW)
    await store.jobs.put(job)
    assert await store.jobs.get(job.id) == job
    assert [r.id for r in await store.jobs.running()] == [job.id]
    moved = replace(job, state="succeeded", body={**BODY, "state": "succeeded"}, updated_at=NOW + 3)
    await store.jobs.put(moved)
    assert await store.jobs.get(job.id) == moved
    assert await store.jobs.running() == []
    assert await store.jobs.get("job-ffffffffffff") is None


async def test_the_newest_jobs_are_kept_for_a_week(store: Store) -> None:
    old = JobRecord("job-old", "serve", "m", "failed", {}, NOW - KEEP_SECONDS - 1, NOW)
    await store.jobs.put(old)
    for i in range(KEEP + 5):
        model = "a" if i % 2 else "b"
        await store.jobs.put(
            JobRecord(f"job-{i:012x}", "serve", model, "succeeded", {}, NOW - 1000 + i, NOW)
        )
    assert await store.jobs.prune(NOW) == 6
    kept = await store.jobs.newest(KEEP + 10)
    assert len(kept) == KEEP
    assert [r.id for r in kept[:2]] == [f"job-{KEEP + 4:012x}", f"job-{KEEP + 3:012x}"]
    assert await store.jobs.get("job-old") is None
    only_a = await store.jobs.newest(3, model="a")
    assert [r.model for r in only_a] == ["a"] * 3
