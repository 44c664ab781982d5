"""`ctl jobs` and `ctl model serve --wait`: the calls they make, what --follow prints
as a job moves, and the exit status scripts read (0 ready, 1 failed or timed out)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from llmgw.cli import build_parser
from llmgw.client import ctl_jobs, ctl_models
from llmgw.client.admin import AdminClient
from llmgw.client.ctl_jobs import follow_job, job_text, jobs_table

STEPS = ["resolve", "plan", "place", "fetch", "start", "ready"]


def job(step: str, state: str = "running", **over: Any) -> dict[str, Any]:
    at = STEPS.index(step)
    steps = [
        {
            "name": name,
            "state": "done" if i < at else ("pending" if i > at else "running"),
            "started": 100.0 + i if i <= at else None,
            "ended": 101.0 + i if i < at else None,
            "detail": "",
        }
        for i, name in enumerate(STEPS)
    ]
    body: dict[str, Any] = {
        "id": "job-0123456789ab",
        "kind": "serve",
        "model": "m",
        "state": state,
        "step": step,
        "steps": steps,
        "nodes": [],
        "error": None,
        "created": 100.0,
        "updated": 110.0,
    }
    body.update(over)
    return body


def fetching(done: int, rate: float | None) -> dict[str, Any]:
    moving = job("fetch")
    moving["steps"][3]["detail"] = f"{done} B"
    moving["nodes"] = [
        {
            "node": "a",
            "replica_id": "m.default.1",
            "done": done,
            "total": 4 * 2**20,
            "rate_bytes_per_s": rate,
            "file": "m.gguf",
        }
    ]
    return moving


def ended(state: str) -> dict[str, Any]:
    last = job("ready", state)
    for s in last["steps"]:
        s["state"] = "done"
    if state == "failed":
        last = job("fetch", "failed", error={"step": "fetch", "reason": "HTTP 404"})
        last["steps"][3]["state"] = "failed"
    return last


class Jobs(AdminClient):
    """Answers GET /api/v1/jobs/ID with each of ``seen`` in turn (the last again)."""

    def __init__(self, seen: list[dict[str, Any]]) -> None:
        super().__init__("http://cp", "t")
        self.seen = seen
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        if method == "POST":
            return {"name": "m", "job": "job-0123456789ab"}
        if path.startswith("/api/v1/jobs?"):
            return [self.seen[-1]]
        return copy.deepcopy(self.seen.pop(0) if len(self.seen) > 1 else self.seen[0])


def follow(seen: list[dict[str, Any]], **kw: Any) -> tuple[int, Jobs]:
    admin = Jobs(seen)
    return follow_job(admin, "job-0123456789ab", sleep=lambda s: None, **kw), admin


def test_follow_prints_each_move_once_and_exits_0_when_ready(
    capsys: pytest.CaptureFixture[str],
) -> None:
    moves = [job("place"), fetching(2**20, None), fetching(2**20, None), fetching(3 * 2**20, 2**20)]
    status, admin = follow([*moves, ended("succeeded")])
    assert status == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "place running",
        "fetch running: 1048576 B",
        "  a (m.default.1): 1.0 MiB of 4.0 MiB (25%), m.gguf",
        "fetch running: 3145728 B",
        "  a (m.default.1): 3.0 MiB of 4.0 MiB (75%) at 1.0 MiB/s, m.gguf",
        "ready done",
        "m is ready",
    ]
    assert {c[1] for c in admin.calls} == {"/api/v1/jobs/job-0123456789ab"}


def test_a_failed_job_exits_1_naming_its_step_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = follow([job("fetch"), ended("failed")])
    assert status == 1
    assert capsys.readouterr().err.strip() == "serving m failed at fetch: HTTP 404"


def test_a_job_still_running_at_the_timeout_exits_1_saying_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _ = follow([job("start")], timeout=0)
    assert status == 1
    err = capsys.readouterr().err
    assert "still running after 0 s, at step start" in err
    assert "ctl jobs --follow job-0123456789ab" in err


def test_serve_wait_follows_the_job_the_serve_answered(capsys: pytest.CaptureFixture[str]) -> None:
    admin = Jobs([job("place"), ended("succeeded")])
    args = build_parser().parse_args(["ctl", "model", "serve", "/m.gguf", "--wait", "--json"])
    assert ctl_models.commands(lambda _: admin)["serve"](args) == 0
    assert [c[:2] for c in admin.calls] == [
        ("POST", "/api/v1/models"),
        ("GET", "/api/v1/jobs/job-0123456789ab"),
        ("GET", "/api/v1/jobs/job-0123456789ab"),
    ]
    said = capsys.readouterr()
    assert '"job": "job-0123456789ab"' in said.out and "m is ready" in said.err


def test_ctl_jobs_lists_shows_one_and_follows_the_newest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failed = ended("failed")
    assert "fetch: HTTP 404" in jobs_table([failed], now=130.0)
    assert "30s ago" in jobs_table([failed], now=130.0)
    assert jobs_table([]).startswith("No serve jobs")
    text = job_text(failed)
    assert "failed at fetch: HTTP 404" in text and "resolve" in text
    admin = Jobs([job("ready", "succeeded")])
    args = build_parser().parse_args(["ctl", "jobs", "--follow", "--model", "m"])
    assert ctl_jobs.commands(lambda _: admin)["jobs"](args) == 0
    assert admin.calls[0][1] == "/api/v1/jobs?limit=1&model=m"
