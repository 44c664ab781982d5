"""The catalog and the reconciler with real processes: models served by a real
llama-server on the CPU, scaled, changed, moved off lost and drained nodes, refused
where they cannot fit, explained, and kept across a control plane restart."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from tests.e2e.catalog import (
    ctl,
    ctl_json,
    engine_key,
    join,
    passes,
    replicas,
    scheduled,
    serve,
    wait_ready,
)
from tests.e2e.cluster import Cluster, wait_for
from tests.support.engines import Mirror

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def cmdline(pid: int) -> list[str]:
    return psutil.Process(pid).cmdline()


def test_serve_scale_change_context_and_scale_to_zero(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "n1", binary)
    served = ctl_json(cluster, "model", "serve", str(model), "--name", "tiny", "--context", "256")
    assert served["name"] == "tiny" and served["context"] == 256
    assert served["engine"] == "llama.cpp"
    assert served["shape"]["trained_context"] == 512
    memory_at_256 = served["profiles"][0]["memory"]
    assert memory_at_256 > served["weight_bytes"] > 0

    (first,) = wait_ready(cluster, "tiny", 1)
    assert first["node"] == "n1" and first["profile"] == "default" and not first["stale"]
    # Once the agent has measured its memory read rate, a CPU profile has a speed.
    speed = wait_for(
        lambda: ctl_json(cluster, "model", "show", "tiny")["profiles"][0]["cpu_tokens_per_second"],
        30,
        "a CPU speed estimate",
    )
    assert speed > 1
    assert ["--ctx-size", "256"] == cmdline(first["pid"])[-4:-2]
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{first['port']}/v1",
        api_key=engine_key(cluster, first["replica_id"]),
    )
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None

    ctl(cluster, "model", "replicas", "tiny", "2")
    two = wait_ready(cluster, "tiny", 2)
    assert first["replica_id"] in {r["replica_id"] for r in two}
    assert len({r["port"] for r in two}) == 2
    shown = ctl(cluster, "models").stdout
    assert "tiny" in shown and "2/2" in shown and "serving" in shown

    # A new context replaces the replicas one by one: never fewer than two ready.
    changed = ctl_json(cluster, "model", "context", "tiny", "512")
    new_fp = changed["profiles"][0]["fingerprint"]
    assert changed["context"] == 512 and changed["profiles"][0]["memory"] > memory_at_256
    fewest = 2
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        rows = replicas(cluster, "tiny")
        fewest = min(fewest, sum(1 for r in rows if r["state"] == "ready"))
        if len(rows) == 2 and all(
            r["fingerprint"] == new_fp and r["state"] == "ready" for r in rows
        ):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the context change did not finish: {replicas(cluster, 'tiny')}")
    assert fewest >= 2
    for row in rows:
        assert row["replica_id"] not in {r["replica_id"] for r in two}
        assert cmdline(row["pid"])[-4:] == ["--ctx-size", "512", "--parallel", "1"]
    assert ctl_json(cluster, "model", "show", "tiny")["context"] == 512

    # The longest answer alone changes the catalog and restarts nothing.
    ctl(cluster, "model", "context", "tiny", "--max-output", "200")
    assert ctl_json(cluster, "model", "show", "tiny")["max_output"] == 200
    out = ctl(cluster, "model", "context", "tiny", "4096", check=False)
    assert out.returncode != 0 and "past the 512 the model was trained for" in out.stderr
    passes(cluster)
    assert {r["replica_id"] for r in replicas(cluster, "tiny")} == {r["replica_id"] for r in rows}

    pids = [r["pid"] for r in rows]
    ctl(cluster, "model", "replicas", "tiny", "0")
    wait_ready(cluster, "tiny", 0, timeout=30)
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 15, "engines to exit")
    assert ctl_json(cluster, "model", "show", "tiny")["state"] == "scaled to zero"

    audit = sqlite3.connect(cluster.data_dir / "store.db").execute(
        "SELECT actor, action, target, detail FROM audit WHERE target = 'tiny' ORDER BY id"
    )
    actions = [(a, act) for a, act, _, _ in audit]
    assert [act for _, act in actions] == [
        "model.serve",
        "model.replicas",
        "model.context",
        "model.context",
        "model.replicas",
    ]
    assert all(actor.startswith("admin@") for actor, _ in actions)


def test_replicas_move_off_a_drained_node_and_a_lost_one_without_duplicates(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    join(cluster, "b", binary)
    serve(cluster, model, "tiny")
    (on_x,) = wait_ready(cluster, "tiny", 1)
    # Binpack takes whichever node has less free memory at that moment: call it x.
    x = on_x["node"]
    y = "b" if x == "a" else "a"

    # Drain: started on y first, then stopped on x.
    ctl(cluster, "node", "drain", x)
    wait_for(
        lambda: [r["node"] for r in replicas(cluster, "tiny") if r["state"] == "ready"] == [y],
        60,
        f"the replica to move to {y}",
    )
    assert not psutil.pid_exists(on_x["pid"]) or wait_for(
        lambda: not psutil.pid_exists(on_x["pid"]), 15, f"the engine on {x} to stop"
    )
    explained = ctl_json(cluster, "explain", "tiny")
    verdicts = {v["node"]: v for v in explained[0]["verdicts"]}
    assert verdicts[x]["ok"] is False and "node cordoned" in verdicts[x]["reasons"]
    assert verdicts[y]["ok"] is True and verdicts[y]["holds_weights"] is True
    assert explained[0]["running_on"] == [y]
    ctl(cluster, "node", "uncordon", x)

    # y's agent dies (its engine lives on): past the grace the replica is placed on x.
    (on_y,) = replicas(cluster, "tiny")
    cluster.agents[y].signal(signal.SIGKILL)
    cluster.wait_state(y, "NotReady", 15)
    moved = wait_for(
        lambda: [r for r in replicas(cluster, "tiny") if r["node"] == x and r["state"] == "ready"],
        60,
        f"a replacement on {x}",
    )
    assert psutil.pid_exists(on_y["pid"])  # still running, out of reach

    # y comes back still running its engine: adopted, then the extra stopped.
    join(cluster, y, binary, token=False)
    final = wait_ready(cluster, "tiny", 1, timeout=60)
    assert final[0]["replica_id"] in {moved[0]["replica_id"], on_y["replica_id"]}
    wait_for(
        lambda: sum(psutil.pid_exists(p) for p in (on_y["pid"], moved[0]["pid"])) == 1,
        20,
        "one engine left",
    )


def test_too_large_refused_with_every_nodes_reason_and_bad_profiles_named(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    join(cluster, "b", binary)
    out = ctl(cluster, "model", "serve", str(model), "--memory", "100TiB", check=False)
    assert out.returncode != 0
    assert "fits no node" in out.stderr
    for node in ("a:", "b:"):
        assert f"{node} memory: needs 102400.0 GiB" in out.stderr
    status, body = cluster.api_error(
        "/api/v1/models", body={"source": str(model), "name": "big", "gpus": 1}
    )
    assert status == 409 and body["error"]["type"] == "does_not_fit"
    assert {v["node"] for v in body["error"]["verdicts"]} == {"a", "b"}
    assert all("cards: needs 1" in v["reasons"][0] for v in body["error"]["verdicts"])

    cases = {
        "-m": "argument '-m' is not allowed",
        "--ctx-size": "set by llmgw from the catalog",
    }
    for flag, words in cases.items():
        status, body = cluster.api_error(
            "/api/v1/models", body={"source": str(model), "args": [flag, "x"]}
        )
        assert status == 400 and words in body["error"]["message"]
    status, body = cluster.api_error(
        "/api/v1/models", body={"source": str(model), "context": 10_000_000}
    )
    assert status == 400 and body["error"]["field"] == "context"
    assert "trained for" in body["error"]["message"]
    status, body = cluster.api_error(
        "/api/v1/models", body={"source": "hf:org/repo:weights/model.bin"}
    )
    assert status == 400 and "pickle" in body["error"]["message"]
    # Nothing was kept of any refusal.
    assert cluster.api("/api/v1/models") == []


def test_restart_of_the_control_plane_rebuilds_replicas_and_flags_stale_ones(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    serve(cluster, model, "tiny")
    ctl(cluster, "model", "replicas", "tiny", "2")
    before = {r["replica_id"]: r["pid"] for r in wait_ready(cluster, "tiny", 2)}

    # The store changes behind the control plane's back (a restored backup, a hand
    # edit): the running replicas no longer match their profile.
    assert cluster.server is not None
    cluster.server.signal(signal.SIGKILL)
    cluster.server.popen.wait(10)
    db = sqlite3.connect(cluster.data_dir / "store.db")
    spec = json.loads(db.execute("SELECT spec FROM models WHERE name = 'tiny'").fetchone()[0])
    spec["context"] = 384
    db.execute("UPDATE models SET spec = ? WHERE name = 'tiny'", (json.dumps(spec),))
    db.commit()
    db.close()
    cluster.start_server()
    cluster.wait_state("a", "Ready", 20)

    rows = wait_ready(cluster, "tiny", 2)
    assert {r["replica_id"]: r["pid"] for r in rows} == before
    assert all(r["stale"] and "stale" in r["note"] for r in rows)
    passes(cluster, 4)  # several passes: nothing is restarted behind the operator's back
    assert {r["replica_id"]: r["pid"] for r in wait_ready(cluster, "tiny", 2)} == before
    shown = ctl_json(cluster, "model", "show", "tiny")
    assert shown["stale"] == 2 and "model restart tiny" in shown["profiles"][0]["status"]["note"]

    ctl(cluster, "model", "restart", "tiny")
    fresh = wait_for(
        lambda: (
            (rows := wait_ready(cluster, "tiny", 2))
            and not set(before) & {r["replica_id"] for r in rows}
            and rows
        ),
        90,
        "fresh replicas",
    )
    assert not any(r["stale"] for r in fresh)
    assert all(cmdline(r["pid"])[-4:-2] == ["--ctx-size", "384"] for r in fresh)


def test_a_change_with_no_room_beside_is_refused_unless_in_place(
    cluster: Cluster, binary: Path, model: Path
) -> None:
    join(cluster, "a", binary)
    node = cluster.nodes()["a"]
    # Room for one replica's promise on this node, not for a second beside it.
    memory = int(node["memory_available"] * 0.75) // 1024**2 * 1024**2
    serve(cluster, model, "tiny", "--memory", str(memory))
    (old,) = wait_ready(cluster, "tiny", 1)

    out = ctl(cluster, "model", "context", "tiny", "512", check=False)
    assert out.returncode != 0
    assert "no room to start the changed replicas of tiny beside" in out.stderr
    assert "--in-place" in out.stderr
    assert ctl_json(cluster, "model", "show", "tiny")["context"] == 256  # nothing changed
    assert [r["replica_id"] for r in replicas(cluster, "tiny")] == [old["replica_id"]]

    changed = ctl_json(cluster, "model", "context", "tiny", "512", "--in-place")
    assert changed["context"] == 512
    (new,) = wait_for(
        lambda: [r for r in wait_ready(cluster, "tiny", 1) if r["replica_id"] != old["replica_id"]],
        60,
        "the replacement",
    )
    assert cmdline(new["pid"])[-4:-2] == ["--ctx-size", "512"]
    assert not psutil.pid_exists(old["pid"])


def test_on_demand_a_second_profile_cards_refused_and_remove_with_files(
    cluster: Cluster, binary: Path, model: Path, tmp_path: Path
) -> None:
    (tmp_path / "files").mkdir()
    mirror = Mirror(tmp_path / "files")
    shutil.copy(model, mirror.root / "tiny.gguf")
    try:
        join(cluster, "a", binary)
        # The control plane reads the header over HTTP; the node downloads the file.
        served = ctl_json(
            cluster,
            "model",
            "serve",
            f"{mirror.url}/tiny.gguf",
            "--name",
            "od",
            "--on-demand",
            "--context",
            "256",
        )
        assert served["shape"]["trained_context"] == 512
        assert served["state"] == "idle" and served["desired"] == 0
        passes(cluster)
        assert replicas(cluster, "od") == []
        cluster.api("/api/v1/models/od/demand", body={})
        (first,) = wait_ready(cluster, "od", 1)

        # A second profile, on the CPU, below the first.
        shown = ctl_json(cluster, "model", "replicas", "od", "1", "--profile", "cpu2")
        profiles = {p["name"]: p for p in shown["profiles"]}
        assert profiles["cpu2"]["priority"] < profiles["default"]["priority"]
        rows = wait_ready(cluster, "od", 2)
        assert sorted(r["profile"] for r in rows) == ["cpu2", "default"]

        # Cards no node has: one, or two for llama.cpp's layers split across them.
        out = ctl(cluster, "model", "gpus", "od", "1", "--profile", "default", check=False)
        assert out.returncode != 0 and "fits no node" in out.stderr
        assert "a: cards: needs 1 with" in out.stderr
        out = ctl(cluster, "model", "gpus", "od", "2", "--profile", "default", check=False)
        assert out.returncode != 0 and "a: cards: needs 2 with" in out.stderr

        def held() -> list[Any]:
            return [w for w in cluster.api("/api/v1/weights") if w["source"] == served["source"]]

        assert held() and held()[0]["wanted"]
        ctl(cluster, "model", "remove", "od", "--with-files")
        wait_ready(cluster, "od", 0, timeout=30)
        wait_for(lambda: not held(), 30, "the node to delete the model's files")
        assert cluster.api("/api/v1/models") == []
        assert not psutil.pid_exists(first["pid"]) or wait_for(
            lambda: not psutil.pid_exists(first["pid"]), 10, "the engine to exit"
        )
    finally:
        mirror.close()
