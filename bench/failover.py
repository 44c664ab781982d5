"""Failover benchmark: the leading control plane killed under load.

For each way of running standbys, ``--runs`` times over (5 by default), from nothing:

1. a leader (``server init``; SQLite, or PostgreSQL with ``--store postgres``) with one
   agent that runs the fake engine as its llama.cpp (``bench/fake_engine.py``), model
   ``tiny`` Ready on it, and a gateway key;
2. a standby (``server token`` on the leader, ``server join``, ``server run``) serving
   ``/v1`` with that key;
3. four client threads send chat completions to the standby without pause;
4. the leader is killed (-9). With SQLite, ``server promote`` runs on the standby at
   once (the operator's act); with PostgreSQL the standby takes the lease by itself;
5. measured from the kill: **writable**, the first ``POST /api/v1/keys`` the standby
   accepts (201); **agents Ready**, the node Ready and connected on it; and **failed**,
   the clients' requests that failed through the standby from the kill to 3 s after both.

Ways: ``sqlite`` (promote), ``postgres`` (one PostgreSQL 15 on loopback, started as
the postgres user; the lease, ``ha.lease_seconds`` 10), and ``patroni`` (etcd, Patroni
and two PostgreSQL 15 with synchronous replication, ttl 10: there the store's primary is
killed instead, with its Patroni, and "writable" is the first key either control plane
accepts once Patroni has promoted the replica). The targets (from the issue): 0
failed requests through a standby; agents Ready on the new leader within 15 s; with a
lease, writable within 10 s of the store's own failover (here the store does not fail,
so that is the lease's time).

    .venv/bin/python bench/failover.py                  # every way, 5 runs each
    .venv/bin/python bench/failover.py --ways sqlite --runs 3 --json /tmp/failover.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from gateway import (  # noqa: E402
    BODY,
    FAKE_ENGINE,
    PATH,
    BenchError,
    Processes,
    answers,
    free_port,
    http,
    llmgw,
    wait_for,
)
from host import machine  # noqa: E402

SCHEDULING = "\nscheduling:\n  interval: 0.5\n"
TARGET_AGENTS_S = 15.0
TARGET_WRITABLE_S = 10.0


class Load:
    """Four clients sending chat completions to one control plane without pause."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base, key
        self.done = 0
        self.failed: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(4)]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                status, raw = http(self.base + PATH, token=self.key, body=BODY, timeout=30)
            except OSError as exc:
                self.failed.append((time.monotonic(), str(exc)))
                continue
            if status == 200:
                self.done += 1
            else:
                self.failed.append((time.monotonic(), f"HTTP {status}: {raw[:120]!r}"))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        wait_for(lambda: self.done >= 20, 30, "requests to flow through the standby")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(35)


def leader_code(base: str) -> int:
    try:
        return http(base + "/leader", timeout=2)[0]
    except OSError:
        return 0


def one_run(way: str, root: Path, dsn: str | None, patroni: Any = None) -> dict[str, Any]:
    procs = Processes(root)
    try:
        a, b = root / "a", root / "b"
        ports = {n: free_port() for n in ("a", "a-agents", "a-peers", "b", "b-agents", "b-peers")}
        store = ["--store", "postgres", "--dsn", dsn] if dsn else []
        llmgw(
            "server", "init", "--data-dir", str(a), "--listen", f"127.0.0.1:{ports['a']}",
            "--agent-port", str(ports["a-agents"]), "--peer-port", str(ports["a-peers"]),
            "--name", "cp-a", "--advertise", "127.0.0.1", *store, "--yes",
        )  # fmt: skip
        (a / "server.yaml").write_text((a / "server.yaml").read_text() + SCHEDULING)
        leader = procs.start(
            "cp-a", [sys.executable, "-m", "llmgw", "server", "run", "--data-dir", str(a)]
        )
        base_a = f"http://127.0.0.1:{ports['a']}"
        wait_for(lambda: procs.check("cp-a") or leader_code(base_a) == 200, 30, "cp-a to lead")
        admin = (a / "admin.token").read_text().strip()
        wrapper = root / "fake-llama-server"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_ENGINE} "$@"\n')
        wrapper.chmod(0o755)
        token = llmgw("node", "token", "--data-dir", str(a)).strip()
        procs.start(
            "agent",
            [sys.executable, "-m", "llmgw", "agent", "run", "--server", f"127.0.0.1:{ports['a']}",
             "--token", token, "--state-dir", str(root / "agent"), "--node-id", "n1",
             "--weights-dir", str(root / "weights"), "--engine", f"llama.cpp={wrapper}"],
        )  # fmt: skip
        from tests.support.tinymodel import write_tiny_model

        gguf = write_tiny_model(root / "tiny.gguf")

        def node_ready(base: str) -> bool:
            status, raw = http(base + "/api/v1/nodes", token=admin)
            nodes = json.loads(raw) if status == 200 else []
            return any(n["state"] == "Ready" and n["connected"] for n in nodes)

        wait_for(lambda: procs.check("agent") or node_ready(base_a), 60, "the node")
        llmgw(
            "ctl", "model", "serve", str(gguf), "--name", "tiny", "--context", "256",
            "--memory", "1GiB", "--data-dir", str(a),
        )  # fmt: skip
        key = json.loads(
            llmgw("ctl", "keys", "create", "--name", "b", "--json", "--data-dir", str(a))
        )["key"]
        wait_for(lambda: http(base_a + PATH, token=key, body=BODY)[0] == 200, 60, "tiny")

        server_token = llmgw(
            "server", "token", "--data-dir", str(a), "--server", f"127.0.0.1:{ports['a']}"
        ).strip()
        llmgw(
            "server", "join", "--server", f"127.0.0.1:{ports['a']}", "--token", server_token,
            "--data-dir", str(b), "--listen", f"127.0.0.1:{ports['b']}",
            "--agent-port", str(ports["b-agents"]), "--peer-port", str(ports["b-peers"]),
            "--advertise", "127.0.0.1", "--name", "cp-b",
        )  # fmt: skip
        (b / "server.yaml").write_text((b / "server.yaml").read_text() + SCHEDULING)
        procs.start("cp-b", [sys.executable, "-m", "llmgw", "server", "run", "--data-dir", str(b)])
        base_b = f"http://127.0.0.1:{ports['b']}"
        wait_for(lambda: procs.check("cp-b") or answers(base_b + "/healthz"), 30, "cp-b")
        wait_for(lambda: http(base_b + PATH, token=key, body=BODY)[0] == 200, 30, "cp-b to serve")

        with Load(base_b, key) as load:
            time.sleep(1.0)  # the load steady before the kill
            if patroni is not None:
                # The store's primary dies (with its Patroni); both control planes live.
                patroni.kill_primary_postgres()
            else:
                leader.send_signal(signal.SIGKILL)
                with contextlib.suppress(psutil.Error):
                    leader.wait(10)
            killed = time.monotonic()
            if way == "sqlite":
                llmgw("server", "promote", "--data-dir", str(b))
            bases = [base_a, base_b] if patroni is not None else [base_b]

            def writable() -> str | None:
                body = json.dumps({"name": f"after-{time.monotonic_ns()}"})
                for base in bases:
                    with contextlib.suppress(OSError):
                        if http(base + "/api/v1/keys", token=admin, body=body)[0] == 201:
                            return base
                return None

            leads = wait_for(writable, 60, "a control plane to take writes", step=0.05)
            writable_s = time.monotonic() - killed
            wait_for(lambda: node_ready(leads), 60, "the node Ready on the leader", step=0.1)
            agents_s = time.monotonic() - killed
            time.sleep(3.0)
            failed = [f for f in load.failed if f[0] >= killed]
            served = load.done
        return {
            "way": way,
            "writable_s": round(writable_s, 2),
            "agents_ready_s": round(agents_s, 2),
            "failed": len(failed),
            "served": served,
            "failures": [why for _, why in failed[:3]],
        }
    finally:
        procs.stop_all()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ways", default="sqlite,postgres,patroni")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="write every run's figures here")
    args = p.parse_args(argv)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    print(f"llmgw failover benchmark: {machine()}; {args.runs} runs a way", flush=True)
    results: list[dict[str, Any]] = []
    pg = ha = None
    try:
        for way in ways:
            if way == "postgres" and pg is None:
                from tests.support.postgres import start_postgres

                pg = start_postgres()
            if way == "patroni" and ha is None:
                from tests.support.patroni import PatroniCluster

                ha = PatroniCluster.new()
                ha.start()
            for run in range(1, args.runs + 1):
                with tempfile.TemporaryDirectory(prefix="llmgw-failover-") as tmp:
                    name = f"failover_{run}_{int(time.time())}"
                    dsn = None
                    if way == "postgres":
                        assert pg is not None
                        dsn = pg.create_database(name)
                    elif way == "patroni":
                        assert ha is not None
                        ha.heal()
                        dsn = ha.create_database(name)
                    row = one_run(way, Path(tmp), dsn, ha if way == "patroni" else None)
                row["run"] = run
                results.append(row)
                print(
                    f"  {way:9s} run {run}: writable {row['writable_s']:6.2f} s  agents Ready "
                    f"{row['agents_ready_s']:6.2f} s  failed {row['failed']} of "
                    f"{row['served'] + row['failed']}"
                    + (f"  {row['failures']}" if row["failed"] else ""),
                    flush=True,
                )
    except BenchError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if pg is not None:
            pg.remove()
        if ha is not None:
            ha.stop()
    print("\nway        writable s (median)  agents Ready s (median)  failed requests (all runs)")
    for way in ways:
        rows = [r for r in results if r["way"] == way]
        if not rows:
            continue
        w = statistics.median(r["writable_s"] for r in rows)
        ag = statistics.median(r["agents_ready_s"] for r in rows)
        failed = sum(r["failed"] for r in rows)
        print(f"{way:10s} {w:19.2f}  {ag:23.2f}  {failed}")
        print(
            f"target {way}: 0 failed requests: {'met' if failed == 0 else 'NOT met'}; agents "
            f"Ready <= {TARGET_AGENTS_S:g} s: {'met' if ag <= TARGET_AGENTS_S else 'NOT met'}"
            + (
                f"; writable within the lease ({TARGET_WRITABLE_S:g} s) and a round (2 s): "
                f"{'met' if w <= TARGET_WRITABLE_S + 2 else 'NOT met'}"
                if way == "postgres"
                else ""
            )
            + (
                f"; writable <= {TARGET_WRITABLE_S:g} s (Patroni's ttl): "
                f"{'met' if w <= TARGET_WRITABLE_S else 'NOT met'}"
                if way == "patroni"
                else ""
            )
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
