"""What a run of ``bench/gateway.py`` says: its table, each way against the others, the
issues' targets met or not, and a py-spy profile of the control plane split by part.

Apart from the running of the loads (``bench/gateway.py``), so a report can be made
again from a run's JSON and the profile's split tested on its own.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The targets for one gateway process, to a replica and to a provider alike (issue 34;
# issue 5's were 0.5 ms, 3,500 and 2,500).
TARGET_ADDED_P50_MS = 0.25
TARGET_RPS_C16 = 5000.0
TARGET_STREAM_RPS_C16 = 3000.0
TARGET_VS_LITELLM = 20.0
# The replica's CPU a streamed request over the provider's, and the control plane's RSS
# after the load (issue 34).
TARGET_STREAM_CPU_VS_EXTERNAL = 1.2
TARGET_RSS_MB = 100.0
# What limits at four levels may cost against a bare key (issue 28).
TARGET_LEVELS_ADDED_P50_MS = 0.05
TARGET_LEVELS_RPS_DROP = 0.05


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# --- profile ------------------------------------------------------------------------------


_OUTER = (
    "_run_module_as_main ", "_run_code ", "<module> ", "entry ", "main ", "run ",
    "cmd_server_run ", "Runner.run ", "BaseEventLoop.run", "BaseEventLoop._run_once ",
    "Handle._run ",
)  # fmt: skip


# A streamed request's parts (issue 34), each a pattern on a frame ("function (file.py)"):
# a sample goes to the first part matching the innermost frame that any part matches; a
# sample with no such frame is the event loop's own C code (uvloop: the sockets' reads
# and writes, the kernel under them) or the entry point's.
PARTS = (
    ("parsing (the request's JSON)", r"^parse \(checks\.py\)|^Gateway\._read_body "),
    (
        "usage (stream tap, records)",
        r"^StreamTap\.|^read_usage |^answer_usage |record \(service\.py\)|^Usage\.",
    ),
    ("checks (key, limits, body)", r"\((checks|keyservice|limits|levels|grants)\.py\)"),
    ("routing (router, fair queue)", r"\((router|queue|kvroute|blockhash)\.py\)"),
    ("resume journal", r"\(resume\.py\)"),
    ("engine client", r"\(engineclient\.py\)"),
    ("metrics", r"\(metrics\.py\)"),
    (
        "HTTP server (aiohttp)",
        r"\((web_protocol|web_response|http_writer|http_parser|web_request)\.py\)",
    ),
    ("the rest of the request path", r"\((service|proxy|front|errors)\.py\)"),
)
_PARTS = tuple((name, re.compile(pattern)) for name, pattern in PARTS)
_LOOP = "event loop and sockets (uvloop's C code, the kernel)"


def part_of(frames: Sequence[str]) -> str:
    """The part a sample's stack (root first) belongs to (``PARTS``)."""
    for frame in reversed(frames):
        for name, pattern in _PARTS:
            if pattern.search(frame):
                return name
    return _LOOP


def split_profile(raw: str, requests: int, cpu_us: float) -> list[str]:
    """py-spy's raw, collapsed stacks read: the CPU a request by part (``PARTS``), the top
    functions by own time and by time including callees."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        if not stack.strip():
            idle += n  # no Python frame: waiting in the kernel (epoll)
            continue
        frames = [re.sub(r" \((.*/)?([^/]+\.py):\d+\)", r" (\2)", f) for f in stack.split(";")]
        own[frames[-1]] += n
        parts[part_of(frames)] += n
        for frame in set(frames):
            inclusive[frame] += n
    busy = max(total - idle, 1)
    lines = [
        f"{requests:,} requests, {cpu_us:.0f} us of CPU each (py-spy attached); "
        f"by part, from {busy} busy samples:"
    ]
    lines += [
        f"  {100 * n / busy:5.1f}%  {n / busy * cpu_us:5.0f} us  {name}"
        for name, n in sorted(parts.items(), key=lambda kv: -kv[1])
    ]
    lines.append(f"{total} samples, {100 * idle / max(total, 1):.1f}% idle; own time:")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(15)]
    lines.append("including callees (the event loop and the entry point left out):")
    shown = [(f, n) for f, n in inclusive.most_common() if not f.startswith(_OUTER)]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in shown[:25]]
    return lines


# --- report -------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def figure(rounds: Sequence[dict[str, Any]], run: str, field: str) -> float | None:
    """The median over rounds of one figure of one way, None where it was not measured."""
    values = [r[run][field] for r in rounds if run in r and r[run][field] is not None]
    return median(values) if values else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"x{a / b:.3f}" if a is not None and b else "-"


# (run, figure, words) compared side by side between two ways.
_COMPARED = (
    ("c1", "p50_ms", "p50 at c=1"),
    ("c16", "rps", "req/s at c=16"),
    ("c16", "cpu_us", "CPU us a request at c=16"),
    ("c64", "rps", "req/s at c=64"),
    ("stream16", "rps", "streamed req/s at c=16"),
    ("stream16", "cpu_us", "CPU us a streamed request"),
)


def _side_by_side(
    a: Sequence[dict[str, Any]],
    b: Sequence[dict[str, Any]],
    compared: Sequence[tuple[str, str, str]],
) -> str:
    """Each figure both ways have, ``a``'s against ``b``'s."""
    parts = []
    for run, name, words in compared:
        x, y = figure(a, run, name), figure(b, run, name)
        if x is not None and y is not None:
            parts.append(f"{words} {x:,.3f} against {y:,.3f} ({_ratio(x, y)})")
    return "; ".join(parts)


def report(results: dict[str, Any]) -> list[str]:
    ways: dict[str, list[dict[str, Any]]] = results["ways"]
    lines = [
        "way        round  c=1 p50  c=1 p99   c=16 req/s  p50    p99   CPU us   c=64 req/s  p50"
        "    p99     stream c=16 req/s  CPU us  RSS MB",
    ]
    for name, rounds in ways.items():
        for i, r in enumerate(rounds, start=1):
            if "error" in r:
                lines.append(f"{name:9}  not measured: {r['error']}")
                continue
            row = f"{name:9}  {i:5}  "
            c1 = r.get("c1", {})
            row += f"{fmt(c1.get('p50_ms')):>7}  {fmt(c1.get('p99_ms')):>7}  "
            for run in ("c16", "c64"):
                x = r.get(run)
                row += (
                    f"{x['rps']:11.0f}  {fmt(x['p50_ms'], 2):>5}  {fmt(x['p99_ms'], 2):>6}  "
                    if x
                    else f"{'-':>11}  {'-':>5}  {'-':>6}  "
                )
                if run == "c16":
                    row += f"{x['cpu_us']:6.0f}  " if x else f"{'-':>6}  "
            s16 = r.get("stream16")
            row += (
                f"{s16['rps']:20.0f}  {s16['cpu_us']:6.0f}  " if s16 else f"{'-':>20}  {'-':>6}  "
            )
            row += f"{r['rss_mb']:6.0f}"
            lines.append(row)
    errors = {
        f"{n}/{i}/{run}": x["non_2xx"] + x["socket_errors"]
        for n, rounds in ways.items()
        for i, r in enumerate(rounds, start=1)
        if "error" not in r
        for run, x in r.items()
        if isinstance(x, dict) and x.get("non_2xx", 0) + x.get("socket_errors", 0)
    }
    lines.append(f"errors (non-2xx or socket): {errors or 'none'}")
    measured = {n: rs for n, rs in ways.items() if rs and "error" not in rs[0]}
    if any(len(rs) > 1 for rs in measured.values()):
        lines.append("(medians over the rounds below)")
    direct = measured.get("direct")
    gateways = [n for n in measured if n not in ("direct", "litellm")]
    targets: dict[str, Any] = {}
    for name in gateways:
        gw = measured[name]
        p50, rps, srps = (
            figure(gw, "c1", "p50_ms"),
            figure(gw, "c16", "rps"),
            figure(gw, "stream16", "rps"),
        )
        if direct:
            d50 = figure(direct, "c1", "p50_ms")
            added = p50 - d50 if p50 is not None and d50 is not None else None
            lines.append(
                f"{name} vs direct: {fmt(added, 3)} ms added p50 at c=1 "
                f"({fmt(p50)} against {fmt(d50)}); "
                f"req/s {_ratio(rps, figure(direct, 'c16', 'rps'))} at c=16, "
                f"{_ratio(figure(gw, 'c64', 'rps'), figure(direct, 'c64', 'rps'))} at c=64, "
                f"{_ratio(srps, figure(direct, 'stream16', 'rps'))} streamed at c=16"
            )
            if added is not None and not name.startswith("base"):
                targets[f"{name}/added_p50_ms"] = (
                    added,
                    added <= TARGET_ADDED_P50_MS,
                    TARGET_ADDED_P50_MS,
                )
        if not name.startswith("base"):
            if rps is not None:
                targets[f"{name}/rps_c16"] = (rps, rps >= TARGET_RPS_C16, TARGET_RPS_C16)
            if srps is not None:
                targets[f"{name}/stream_rps_c16"] = (
                    srps,
                    srps >= TARGET_STREAM_RPS_C16,
                    TARGET_STREAM_RPS_C16,
                )
    for name in gateways:
        base = measured.get(name.replace("llmgw", "base", 1)) if name.startswith("llmgw") else None
        if base is None:
            continue
        side = _side_by_side(measured[name], base, _COMPARED)
        lines.append(f"{name} vs {name.replace('llmgw', 'base', 1)}: {side}")
    traced, untraced = measured.get("traced"), measured.get("llmgw")
    if traced and untraced:
        side = _side_by_side(traced, untraced, [c for c in _COMPARED if c[0] != "c64"])
        lines.append(f"traced (tracing on) vs llmgw (off): {side}")
    for name in gateways:
        bare = measured.get(name.removesuffix("-levels")) if name.endswith("-levels") else None
        if bare is None:
            continue
        gw = measured[name]
        p50, b50 = figure(gw, "c1", "p50_ms"), figure(bare, "c1", "p50_ms")
        rps, brps = figure(gw, "c16", "rps"), figure(bare, "c16", "rps")
        added = p50 - b50 if p50 is not None and b50 is not None else None
        drop = 1 - rps / brps if rps is not None and brps else None
        lines.append(
            f"{name} vs {name.removesuffix('-levels')} (a bare key): {fmt(added, 3)} ms added "
            f"p50 at c=1 ({fmt(p50)} against {fmt(b50)}); req/s at c=16 {fmt(rps, 0)} "
            f"against {fmt(brps, 0)} ({_ratio(rps, brps)})"
        )
        if added is not None:
            targets[f"{name}/levels_added_p50_ms"] = (
                added,
                added < TARGET_LEVELS_ADDED_P50_MS,
                TARGET_LEVELS_ADDED_P50_MS,
            )
        if drop is not None:
            targets[f"{name}/levels_rps_drop"] = (
                drop,
                drop < TARGET_LEVELS_RPS_DROP,
                TARGET_LEVELS_RPS_DROP,
            )
    ours, ext = measured.get("llmgw"), measured.get("llmgw-ext")
    if ours and ext:
        cpu, ext_cpu = figure(ours, "stream16", "cpu_us"), figure(ext, "stream16", "cpu_us")
        if cpu is not None and ext_cpu:
            lines.append(
                f"llmgw vs llmgw-ext: CPU a streamed request {cpu:.0f} us against "
                f"{ext_cpu:.0f} us (x{cpu / ext_cpu:.2f})"
            )
            ratio = cpu / ext_cpu
            targets["llmgw/stream_cpu_vs_external"] = (
                ratio,
                ratio <= TARGET_STREAM_CPU_VS_EXTERNAL,
                TARGET_STREAM_CPU_VS_EXTERNAL,
            )
    if ours:
        rss = median([r["rss_mb"] for r in ours if r.get("rss_mb") is not None] or [0.0])
        if rss:
            targets["llmgw/rss_mb"] = (rss, rss < TARGET_RSS_MB, TARGET_RSS_MB)
    lite = measured.get("litellm")
    if ours and lite and direct:
        added = (figure(lite, "c1", "p50_ms") or 0.0) - (figure(direct, "c1", "p50_ms") or 0.0)
        ratio = (figure(ours, "c16", "rps") or 0.0) / (figure(lite, "c16", "rps") or 1.0)
        lines.append(
            f"llmgw vs LiteLLM: req/s x{ratio:.1f} at c=16, "
            f"{_ratio(figure(ours, 'c64', 'rps'), figure(lite, 'c64', 'rps'))} at c=64, "
            f"{_ratio(figure(ours, 'stream16', 'rps'), figure(lite, 'stream16', 'rps'))} "
            f"streamed at c=16; LiteLLM adds {added:.2f} ms p50 at c=1"
        )
        targets["llmgw/vs_litellm"] = (ratio, ratio >= TARGET_VS_LITELLM, TARGET_VS_LITELLM)
    says = {
        "added_p50_ms": "added latency p50 at c=1 <= {t} ms",
        "rps_c16": ">= {t:,.0f} req/s at c=16",
        "stream_rps_c16": ">= {t:,.0f} streamed req/s at c=16",
        "vs_litellm": ">= {t:.0f}x LiteLLM's req/s at c=16",
        "stream_cpu_vs_external": "CPU a streamed request <= {t}x the external provider's",
        "rss_mb": "control plane RSS after the load < {t:.0f} MB",
        "levels_added_p50_ms": "limits at four levels add < {t} ms p50 at c=1 to a bare key's",
        "levels_rps_drop": "limits at four levels cost a bare key's req/s at c=16 < {t:.0%}",
    }
    for name, (value, met, target) in targets.items():
        way, _, what = name.partition("/")
        lines.append(
            f"target {way}: {says[what].format(t=target)}: "
            f"{'met' if met else 'NOT met'} ({value:,.3f})"
        )
    results["targets"] = {
        n: {"value": v, "met": m, "target": t} for n, (v, m, t) in targets.items()
    }
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The report of a bench/gateway.py run again, from what its --json wrote."
    )
    parser.add_argument("results", type=Path, help="the JSON bench/gateway.py --json wrote")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        ways = results["ways"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{args.results}: not a bench/gateway.py result ({exc})", file=sys.stderr)
        return 2
    if not isinstance(ways, dict):
        print(f"{args.results}: its 'ways' is not a map of runs", file=sys.stderr)
        return 2
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
