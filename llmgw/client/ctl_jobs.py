"""``llmgw ctl jobs [ID] [--follow] [--json]``: serve jobs, each a thin call of
``/api/v1/jobs``; and ``follow_job``, which ``ctl model serve --wait`` uses too.

A job's steps are resolve, plan, place, fetch, start, ready. ``--follow`` prints a line
each time the job moves (a step begins or ends, a node's download moves on) and ends
with the job: exit 0 when it succeeded, 1 naming the step that failed and why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TextIO

from llmgw.client import Client, Subcommands, UsageError
from llmgw.client.admin import AdminClient
from llmgw.client.tables import render
from llmgw.wire.admin import JobJson, JobNodeJson

# How often --follow asks.
POLL = 1.0


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _when(at: float | None, now: float) -> str:
    if at is None:
        return ""
    ago = max(0.0, now - at)
    if ago < 120:
        return f"{ago:.0f}s ago"
    if ago < 7200:
        return f"{ago / 60:.0f}m ago"
    return f"{ago / 3600:.0f}h ago"


def download_text(n: JobNodeJson) -> str:
    """A node's download in words: bytes of the total, the rate, the file."""
    if n["done"] is None:
        return f"{n['node']} ({n['replica_id']}): nothing fetched yet"
    text = f"{n['node']} ({n['replica_id']}): {_size(n['done'])}"
    if n["total"]:
        text += f" of {_size(n['total'])} ({100 * n['done'] / n['total']:.0f}%)"
    if n["rate_bytes_per_s"] is not None:
        text += f" at {_size(int(n['rate_bytes_per_s']))}/s"
    if n["file"]:
        text += f", {n['file']}"
    return text


def jobs_table(jobs: list[JobJson], now: float | None = None) -> str:
    if not jobs:
        return "No serve jobs. `llmgw ctl model serve SOURCE` starts one."
    now = time.time() if now is None else now
    rows = []
    for j in jobs:
        why = f"{j['error']['step']}: {j['error']['reason']}" if j["error"] else ""
        rows.append([j["id"], j["model"], j["state"], j["step"], _when(j["created"], now), why])
    return render(["ID", "MODEL", "STATE", "STEP", "CREATED", "WHY"], rows)


def job_text(job: JobJson) -> str:
    out = [f"{job['id']}: serve {job['model']}, {job['state']} (step {job['step']})"]
    rows = []
    for s in job["steps"]:
        took = ""
        if s["started"] is not None and s["ended"] is not None:
            took = f"{s['ended'] - s['started']:.1f}s"
        rows.append([s["name"], s["state"], took, s["detail"]])
    out.append(render(["STEP", "STATE", "TOOK", "DETAIL"], rows))
    if job["nodes"]:
        out.append("")
        out += [f"  {download_text(n)}" for n in job["nodes"]]
    if job["error"]:
        out.append(f"\nfailed at {job['error']['step']}: {job['error']['reason']}")
    return "\n".join(out)


def _moves(job: JobJson) -> list[str]:
    """What --follow prints of a job as it is: its current step and each download."""
    step = next(s for s in job["steps"] if s["name"] == job["step"])
    lines = [f"{job['step']} {step['state']}" + (f": {step['detail']}" if step["detail"] else "")]
    if job["step"] == "fetch":
        lines += [f"  {download_text(n)}" for n in job["nodes"]]
    return lines


def follow_job(
    client: AdminClient,
    job_id: str,
    timeout: float | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the job as it moves until it ends: 0 when it succeeded, 1 when it failed
    or ``timeout`` seconds passed first (said on stderr)."""
    out = sys.stdout if out is None else out
    deadline = None if timeout is None else time.monotonic() + timeout
    said: list[str] = []
    while True:
        job = client.job(job_id)
        if as_json:
            line = json.dumps(job)
            if [line] != said:
                print(line, file=out, flush=True)
                said = [line]
        else:
            lines = _moves(job)
            for line in lines:
                if line not in said:
                    print(line, file=out, flush=True)
            said = lines
        if job["state"] == "succeeded":
            if not as_json:
                print(f"{job['model']} is ready", file=out, flush=True)
            return 0
        if job["state"] == "failed":
            error = job["error"]
            where = f"at {error['step']}: {error['reason']}" if error else ""
            print(f"serving {job['model']} failed {where}", file=sys.stderr, flush=True)
            return 1
        if deadline is not None and time.monotonic() >= deadline:
            print(
                f"{job_id} still running after {timeout:g} s, at step {job['step']}; "
                f"follow it with `llmgw ctl jobs --follow {job_id}`",
                file=sys.stderr,
                flush=True,
            )
            return 1
        sleep(POLL)


def commands(client: Client) -> dict[str, Callable[[argparse.Namespace], int]]:
    def jobs(args: argparse.Namespace) -> int:
        admin = client(args)
        job_id = args.id
        if args.follow:
            if job_id is None:
                newest = admin.jobs(args.model, limit=1)
                if not newest:
                    raise UsageError("no serve jobs to follow; name one (`llmgw ctl jobs`)")
                job_id = newest[0]["id"]
            return follow_job(admin, job_id, args.timeout, args.json)
        if job_id is not None:
            job = admin.job(job_id)
            print(json.dumps(job, indent=2) if args.json else job_text(job))
            return 0
        listed = admin.jobs(args.model, args.limit)
        print(json.dumps(listed, indent=2) if args.json else jobs_table(listed))
        return 0

    return {"jobs": jobs}


def add_parsers(
    ctl_cmds: Subcommands,
    client: Client,
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """``ctl jobs`` under ``llmgw ctl``."""
    run = commands(client)
    p: argparse.ArgumentParser = ctl_cmds.add_parser(
        "jobs",
        help="serve jobs: each step of what `ctl model serve` started, as it goes",
        description="Serve jobs, newest first; with ID one job's steps (resolve, plan, "
        "place, fetch, start, ready) and each node's download. --follow prints each move "
        "until the job ends: exit 0 when it succeeded, 1 naming the step that failed.",
    )
    p.add_argument("id", nargs="?", help="a job's id (job-...); default: the list")
    p.add_argument(
        "--follow", action="store_true", help="follow the job (default: the newest) to its end"
    )
    p.add_argument("--model", help="only this model's jobs")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p.add_argument(
        "--timeout", type=float, help="with --follow: give up after this many seconds (exit 1)"
    )
    p.add_argument(
        "--json", action="store_true", help="print the API's JSON (--follow: one line a change)"
    )
    client_options(p)
    p.set_defaults(handler=run["jobs"])
