"""``llmgw ctl upgrade`` end to end, on one cluster the module's tests use in order: a
control plane, a standby and two agents, each run from its own copy of a zipapp the test
built (the suite's zipapp with another version and the test's release key:
tests/support/releases.py), the tiny model served by a real llama-server on each node,
releases served from loopback.

1. Under the load of four clients (the official openai SDK, ``max_retries=0``): from the
   first version to the second, no request fails, every engine keeps its pid, each
   process keeps its pid (started again in place) and says the new version, and each
   old zipapp is kept beside the new one.
2. Refused with nothing changed (every zipapp byte-identical, the last run as it was): a
   bad signature, a bad checksum, an unknown version, a source answering garbage, an
   older version without ``--downgrade``.
3. A third release whose agent exits at once: the control planes move to it, the first
   node does not come back, the run stops there naming it and the next node is left
   on the version it had; the release fixed and the node's agent started again by hand,
   the same command resumes and finishes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmgw import release
from tests.e2e.catalog import SCHEDULING, ctl, ctl_json, serve, wait_ready
from tests.e2e.cluster import STRAY_MARK, Cluster, Proc, kill_strays, wait_for
from tests.e2e.load import KeptLoad as Load
from tests.support.releases import ReleaseServer, publish, signing_key, versioned_zipapp
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e

V1, V2, V3 = "9.0.0", "9.1.0", "9.2.0"
TAG = release.platform_tag()
# A release whose agent exits as it starts (its control plane starts as usual).
AGENT_DIES = (
    "import sys\n"
    "if sys.argv[1:2] == ['agent']:\n"
    "    sys.exit(3)\n"
    "import _bootstrap\n"
    "_bootstrap.bootstrap()\n"
)
REPO = Path(__file__).resolve().parents[2]
# The catalog's short periods, but a node away for as long as its agent takes to start
# again on a new version (seconds, on this busy machine) keeps its replicas: the
# reconciler placing them elsewhere meanwhile is not what is tested here.
UPGRADE_SCHEDULING = SCHEDULING.replace("node_lost_grace: 3", "node_lost_grace: 120")


def spawn_pyz(pyz: Path, args: list[str], log: Path, shiv_root: Path) -> Proc:
    """``python3 PYZ ARGS``: a process run from its zipapp, as an operator runs it."""
    python = shutil.which("python3") or sys.executable
    env = {
        **os.environ,
        STRAY_MARK: str(log.parent),
        "SHIV_ROOT": str(shiv_root),
    }
    env.pop("PYTHONPATH", None)
    with log.open("a") as fh:
        popen = subprocess.Popen(
            [python, str(pyz), *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env,
            cwd=log.parent,
        )
    return Proc(popen, log)


def llmgw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The test tree's own llmgw (the CLI an operator runs, from anywhere)."""
    return subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class World:
    root: Path
    a: Cluster
    b: Cluster
    key: str
    private_pem: bytes
    releases: ReleaseServer
    v1: Path
    v2: Path
    v3_dies: Path
    v3: Path
    shiv: Path
    binary: Path

    @property
    def source(self) -> str:
        return f"{self.releases.url}/good"

    def pyz(self, name: str) -> Path:
        """Where a process runs from: control planes cp-a, cp-b; nodes a, b."""
        return self.root / "bin" / name / "llmgw.pyz"

    def start_server(self, cluster: Cluster) -> None:
        cluster.server = spawn_pyz(
            self.pyz(cluster.name),
            ["server", "run", "--data-dir", str(cluster.data_dir)],
            cluster.root / "server.log",
            self.shiv,
        )
        wait_for(cluster._up, 60, f"{cluster.name} to answer")

    def start_agent(self, node_id: str, token: str) -> None:
        a = self.a
        a.agents[node_id] = spawn_pyz(
            self.pyz(node_id),
            [
                "agent",
                "run",
                "--state-dir",
                str(a.state_dir(node_id)),
                "--node-id",
                node_id,
                "--weights-dir",
                str(a.root / f"weights-{node_id}"),
                "--server",
                a.listen,
                "--token",
                token,
                "--engine",
                f"llama.cpp={self.binary}",
            ],
            a.root / f"agent-{node_id}.log",
            self.shiv,
        )

    def upgrade(self, *args: str) -> subprocess.CompletedProcess[str]:
        return llmgw("ctl", "upgrade", *args, "--data-dir", str(self.a.data_dir), timeout=240)

    def ask(self, body: dict[str, Any]) -> tuple[int, Any]:
        return self.a.api_error("/api/v1/upgrade", body=body)

    def versions(self) -> dict[str, str]:
        out = {
            "cp-a": self.a.api("/api/v1/status")["version"],
            "cp-b": self.b.api("/api/v1/status")["version"],
        }
        out.update({n: node["version"] for n, node in self.a.nodes().items()})
        return out

    def files(self) -> dict[str, str]:
        return {str(p): digest(p) for p in sorted((self.root / "bin").rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, zipapp: Path, binary: Path) -> Iterator[World]:
    root = tmp_path_factory.mktemp("upgrade")
    pem, public = signing_key()
    built = root / "built"
    v1 = versioned_zipapp(zipapp, V1, public, built / "v1.pyz")
    v2 = versioned_zipapp(zipapp, V2, public, built / "v2.pyz")
    v3_dies = versioned_zipapp(zipapp, V3, public, built / "v3-dies.pyz", main=AGENT_DIES)
    v3 = versioned_zipapp(zipapp, V3, public, built / "v3.pyz")
    tree = root / "releases"
    publish(tree / "good", V2, {TAG: v2}, pem)
    publish(tree / "badsig", V3, {TAG: v3}, pem, tamper="signature")
    publish(tree / "badsum", V3, {TAG: v3}, pem, tamper="checksum")
    for name in ("cp-a", "cp-b", "a", "b"):
        (root / "bin" / name).mkdir(parents=True)
        shutil.copy2(v1, root / "bin" / name / "llmgw.pyz")
    a = Cluster(root / "cp-a", name="cp-a")
    b = Cluster(root / "cp-b", name="cp-b")
    releases = ReleaseServer(tree)
    world: World | None = None
    with releases.running():
        try:
            a.init()
            config = a.data_dir / "server.yaml"
            config.write_text(config.read_text() + UPGRADE_SCHEDULING)
            world = World(root, a, b, "", pem, releases, v1, v2, v3_dies, v3, root / "shiv", binary)
            world.start_server(a)
            b.join_as_standby(a)
            world.start_server(b)
            for node_id in ("a", "b"):
                world.start_agent(node_id, a.token())
            for node_id in ("a", "b"):
                a.wait_state(node_id, "Ready", 60)
            # One replica on each node: the other cordoned while each is placed.
            ctl(a, "node", "cordon", "b")
            serve(a, write_tiny_model(root / "tiny.gguf"), "tiny")
            wait_ready(a, "tiny", 1, timeout=120)
            ctl(a, "node", "uncordon", "b")
            ctl(a, "node", "cordon", "a")
            ctl(a, "model", "replicas", "tiny", "2")
            wait_ready(a, "tiny", 2, timeout=120)
            ctl(a, "node", "uncordon", "a")
            world.key = ctl_json(a, "keys", "create", "--name", "load")["key"]
            yield world
        finally:
            for cluster in (a, b):
                for proc in cluster.agents.values():
                    proc.stop()
                if cluster.server is not None:
                    cluster.server.stop()
            kill_strays(root)


def test_an_upgrade_under_load_fails_no_request_and_keeps_every_engine(world: World) -> None:
    a = world.a
    assert set(world.versions().values()) == {V1}
    pids = {r["replica_id"]: r["pid"] for r in wait_ready(a, "tiny", 2)}
    assert len({r["node"] for r in a.api("/api/v1/replicas")}) == 2  # one on each node
    processes = {
        "cp-a": a.server.popen.pid if a.server else None,
        "cp-b": world.b.server.popen.pid if world.b.server else None,
        **{n: p.popen.pid for n, p in a.agents.items()},
    }

    with Load(a, world.key) as load:
        done = world.upgrade(V2, "--source", world.source, "--node-timeout", "60")
        assert done.returncode == 0, done.stdout + done.stderr
        load.flowing_for(2)
    failed = [(o.error, o.error.__cause__) for o in load.outcomes if o.error is not None]
    assert failed == [], failed[:3]
    assert len(load.outcomes) > 50

    assert f"every process is on {V2}" in done.stdout
    assert world.versions() == {"cp-a": V2, "cp-b": V2, "a": V2, "b": V2}
    assert {r["replica_id"]: r["pid"] for r in wait_ready(a, "tiny", 2)} == pids
    for name, proc in {"cp-a": a.server, "cp-b": world.b.server, **a.agents}.items():
        assert proc is not None and proc.alive(), f"{name} exited:\n{proc and proc.text()}"
        assert proc.popen.pid == processes[name]  # started again in place
    for name in ("cp-a", "cp-b", "a", "b"):
        here = world.pyz(name)
        assert digest(here) == digest(world.v2)
        assert digest(here.with_name(f"llmgw-{V1}.pyz")) == digest(world.v1)
    run = a.api("/api/v1/upgrade")
    assert run["state"] == "done" and run["error"] is None
    status = world.upgrade("status")
    assert status.returncode == 0 and f"Upgrade to {V2}" in status.stdout
    assert f"{V2} from {world.source} (by admin" in status.stdout
    assert [(s["kind"], s["target"], s["state"]) for s in run["steps"]] == [
        ("control-plane", "cp-a", "done"),
        ("control-plane", "cp-b", "done"),
        ("node", "a", "done"),
        ("node", "b", "done"),
    ]


def test_bad_releases_are_refused_with_nothing_changed(world: World) -> None:
    a = world.a
    files = world.files()
    last = a.api("/api/v1/upgrade")

    status, body = world.ask({"version": V3, "source": f"{world.releases.url}/badsig"})
    assert status == 502, body
    assert "not signed by a key this llmgw trusts" in body["error"]["message"]
    status, body = world.ask({"version": V3, "source": f"{world.releases.url}/badsum"})
    assert status == 502, body
    assert "is not the signed" in body["error"]["message"]
    status, body = world.ask({"version": "9.9.9", "source": world.source})
    assert (status, body["error"]["type"]) == (404, "unknown_version"), body
    assert "9.9.9" in body["error"]["message"]
    world.releases.mode = "garbage"
    try:
        status, body = world.ask({"version": V2, "source": world.source, "downgrade": True})
    finally:
        world.releases.mode = "ok"
    assert (status, body["error"]["type"]) == (502, "release_source"), body
    status, body = world.ask({"version": V1, "source": world.source})
    assert (status, body["error"]["type"]) == (409, "downgrade"), body
    assert f"older than the cluster's {V2}" in body["error"]["message"]
    refused = world.upgrade(V1, "--source", world.source)
    assert refused.returncode == 1 and "--downgrade" in refused.stderr

    assert world.files() == files
    assert a.api("/api/v1/upgrade") == last


def test_a_node_that_does_not_come_back_stops_the_run_and_the_same_command_resumes(
    world: World,
) -> None:
    a = world.a
    publish(world.root / "releases" / "good", V3, {TAG: world.v3_dies}, world.private_pem)

    stopped = world.upgrade(V3, "--source", world.source, "--node-timeout", "15")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert f"node a did not come back on {V3} within 15s" in stopped.stderr
    run = a.api("/api/v1/upgrade")
    assert run["state"] == "failed"
    assert [(s["target"], s["state"]) for s in run["steps"]] == [
        ("cp-a", "done"),
        ("cp-b", "done"),
        ("a", "failed"),
        ("b", "pending"),
    ]
    assert world.versions()["b"] == V2  # the next node untouched
    assert digest(world.pyz("b")) == digest(world.v2)

    # The fix: the release rebuilt, and node a's agent started again from the zipapp kept.
    publish(world.root / "releases" / "good", V3, {TAG: world.v3}, world.private_pem)
    agent = a.agents["a"]
    agent.popen.wait(10)
    os.replace(world.pyz("a").with_name(f"llmgw-{V2}.pyz"), world.pyz("a"))
    world.start_agent("a", a.token())
    a.wait_state("a", "Ready", 60)
    planes = {s["target"]: s["ended"] for s in run["steps"] if s["kind"] == "control-plane"}

    resumed = world.upgrade(V3, "--source", world.source, "--node-timeout", "60")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert set(world.versions().values()) == {V3}
    run = a.api("/api/v1/upgrade")
    assert [(s["target"], s["state"]) for s in run["steps"]] == [
        ("cp-a", "done"),
        ("cp-b", "done"),
        ("a", "done"),
        ("b", "done"),
    ]
    # The control planes' steps were not done again.
    assert {s["target"]: s["ended"] for s in run["steps"][:2]} == planes
    wait_ready(a, "tiny", 2)
