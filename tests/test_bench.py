"""Every benchmark in ``bench/`` still starts: its imports and its options are read
against the code as it is now (a benchmark nobody runs rots silently otherwise)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


def test_there_are_benchmarks_to_check() -> None:
    assert {"gateway.py", "scheduler.py", "routing.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_reads_its_options(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


# The quick benchmarks run for real on a small fleet: they build the control plane's own
# records, so a change of those breaks them here and not first in a measurement.
QUICK = {
    "scheduler.py": ["--nodes", "40", "--replicas", "60", "--runs", "1"],
    "pages.py": ["--nodes", "40", "--runs", "1"],
    "heartbeat.py": ["--nodes", "40", "--beats", "13", "--repeat", "1"],
    "exposition.py": ["--nodes", "40", "--repeat", "1"],
}


@pytest.mark.parametrize("script", sorted(QUICK))
def test_the_quick_benchmark_runs_on_a_small_fleet(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *QUICK[script]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "40" in done.stdout


def test_the_agent_bench_sources_say_all_an_agent_session_asks() -> None:
    """``bench/agents.py`` runs llmgw's own ``AgentSession`` on a simulated fact source:
    a method the session came to call (``news`` once did) that the source lacks ends every
    stream in the benchmark and nowhere else."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import agents  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from llmgw.agent.session import FactSource, LiveFigures

    wanted = {n for n in vars(FactSource) if not n.startswith("_")}
    assert wanted, "FactSource names no methods: the check would pass for anything"
    missing = sorted(n for n in wanted if not callable(getattr(agents.SimFacts, n, None)))
    assert missing == []
    # And what a heartbeat reads of its live figures (``ages`` and ``unread`` came later).
    figures = {n for n in vars(LiveFigures) if not n.startswith("_")}
    assert {"gpus", "ages"} <= figures
    fields = {f.name for f in dataclasses.fields(agents.FixedLive)}
    assert sorted(figures - fields) == []


def test_the_gateway_profile_splits_a_request_by_part() -> None:
    # bench/gateway.py --profile: a sample goes to the part of its innermost frame that
    # one names; the entry point and the loop alone are the loop's own C code.
    sys.path.insert(0, str(ROOT))
    from bench.gatewayreport import part_of

    entry = ["<module> (llmgw.py)", "Runner.run (runners.py)"]
    handle = [*entry, "Gateway._answer (service.py)", "Gateway._handle (service.py)"]
    assert part_of(entry).startswith("event loop")
    assert part_of(handle) == "the rest of the request path"
    assert part_of([*handle, "parse (checks.py)", "JSONDecoder.decode (decoder.py)"]).startswith(
        "parsing"
    )
    assert part_of([*handle, "check (checks.py)"]).startswith("checks")
    assert part_of([*handle, "Usage.add (limits.py)"]).startswith("usage")
    relay = [*handle, "Upstream.send (proxy.py)", "Upstream._relay (proxy.py)"]
    assert part_of([*relay, "StreamTap.feed (proxy.py)"]).startswith("usage")
    assert part_of([*relay, "Resume.passing (resume.py)"]) == "resume journal"
    assert part_of([*relay, "EngineConnection.chunk (engineclient.py)"]) == "engine client"
    assert part_of([*relay, "StreamResponse.write (web_response.py)"]).startswith("HTTP server")


def _way(p50: float, rps: float, stream_rps: float, stream_cpu: float, rss: float) -> dict:
    run = {"non_2xx": 0, "socket_errors": 0, "p99_ms": 1.0, "cpu_us": 50.0}
    return {
        "c1": {**run, "p50_ms": p50, "rps": 1000.0},
        "c16": {**run, "p50_ms": 1.0, "rps": rps},
        "stream16": {**run, "p50_ms": 2.0, "rps": stream_rps, "cpu_us": stream_cpu},
        "rss_mb": rss,
    }


def test_a_gateway_run_is_reported_again_from_its_json(tmp_path: Path) -> None:
    """``bench/gatewayreport.py RESULTS`` prints a run's report from what ``--json`` wrote:
    the targets met and not met, errors named by way and run."""
    ways = {
        "direct": [_way(0.05, 90000.0, 7000.0, 100.0, 20.0)],
        "llmgw": [_way(0.25, 9000.0, 4000.0, 240.0, 96.0)],
        "llmgw-ext": [_way(0.22, 9500.0, 6000.0, 150.0, 96.0)],
    }
    ways["llmgw"][0]["c16"]["non_2xx"] = 3
    results = tmp_path / "run.json"
    results.write_text(json.dumps({"ways": ways}))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gatewayreport.py"), str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout
    assert "errors (non-2xx or socket): {'llmgw/1/c16': 3}" in said
    assert "target llmgw: >= 3,000 streamed req/s at c=16: met (4,000.000)" in said
    assert "target llmgw: added latency p50 at c=1 <= 0.25 ms: met (0.200)" in said
    assert "CPU a streamed request <= 1.2x the external provider's: NOT met (1.600)" in said
    assert "target llmgw: control plane RSS after the load < 100 MB: met (96.000)" in said
    results.write_text("{}")
    bad = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gatewayreport.py"), str(results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "not a bench/gateway.py result" in bad.stderr
