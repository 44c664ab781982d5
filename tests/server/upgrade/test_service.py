"""``UpgradeService`` on a real control plane (its admin app in process, its store) with
fake agents and releases served from loopback: every check refuses with nothing changed
(no run, the zipapp byte-identical, no file left beside it), and the steps a pass at a
time: this control plane swapped and started again, an agent too old to be asked
skipped and named, a node that refuses stopping the run, the same version resuming it,
and a node that does not come back failing the run with what was last seen of it."""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw import __version__, release
from llmgw.server.upgrade import service as service_module
from llmgw.wire import admin
from llmgw.wire.messages import Register
from tests.server.slurm.fleet import Plane, plane, slurm_data
from tests.support import nodefacts
from tests.support.agentsession import FakeSession, failed, ok
from tests.support.releases import ReleaseServer, publish, signing_key
from tests.support.shapes import check

__all__ = ["plane", "slurm_data"]

V2 = "9.1.0"
TAG = release.platform_tag()


def fake_zipapp(path: Path, version: str, starts: bool = True) -> Path:
    """A zipapp that says ``llmgw VERSION`` to ``--version`` (or exits 3 at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    main = f"print('llmgw {version}')\n" if starts else "raise SystemExit(3)\n"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__main__.py", main)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Releases:
    def __init__(self, root: Path, server: ReleaseServer, pem: bytes) -> None:
        self.root = root
        self.server = server
        self.pem = pem

    def url(self, tree: str = "good") -> str:
        return f"{self.server.url}/{tree}"


@pytest.fixture
def releases(tmp_path: Path, plane: Plane, monkeypatch: pytest.MonkeyPatch) -> Iterator[Releases]:
    pem, public = signing_key()
    tree = tmp_path / "releases"
    new = fake_zipapp(tmp_path / "built" / "v2.pyz", V2)
    publish(tree / "good", V2, {TAG: new}, pem)
    publish(tree / "badsig", V2, {TAG: new}, pem, tamper="signature")
    publish(tree / "badsum", V2, {TAG: new}, pem, tamper="checksum")
    publish(tree / "elsewhere", V2, {"py39-linux-riscv64": new}, pem)
    publish(tree / "dead", V2, {TAG: fake_zipapp(tmp_path / "built" / "dead.pyz", V2, False)}, pem)
    running = fake_zipapp(tmp_path / "bin" / "llmgw.pyz", "0.1.0")
    monkeypatch.setattr(release, "running_zipapp", lambda argv0=None: running)
    service = plane.cp.upgrades.service
    service.keys = (public,)
    service.timeout = 1.0
    server = ReleaseServer(tree)
    with server.running():
        yield Releases(tmp_path, server, pem)


async def node(p: Plane, node_id: str, version: str, features: list[str]) -> FakeSession:
    await p.cp.registry.enrolled(node_id, 1)
    session = FakeSession()
    await p.cp.registry.register(
        Register(
            node_id=node_id,
            version=version,
            host=nodefacts.facts(hostname=node_id, gpus=[]),
            address="127.0.0.1",
            features=features,
        ),
        session,
    )
    return session


async def start(p: Plane, **body: Any) -> tuple[int, Any]:
    answer = await p.client.post("/api/v1/upgrade", json=body)
    return answer.status_code, answer.json()


async def test_every_check_refuses_with_nothing_changed(
    plane: Plane, releases: Releases, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = releases.root / "bin"
    before = {p.name: digest(p) for p in bin_dir.iterdir()}
    url = releases.url()

    status, body = await start(plane, version="nine", source=url)
    assert status == 400 and "version" in body["error"]["message"]
    status, body = await start(plane, version="9.9.9", source=url)
    assert (status, body["error"]["type"]) == (404, "unknown_version")
    assert "no llmgw release 9.9.9" in body["error"]["message"]
    status, body = await start(plane, version=V2, source=releases.url("badsig"))
    assert (status, body["error"]["type"]) == (502, "release_source")
    assert "not signed by a key this llmgw trusts" in body["error"]["message"]
    status, body = await start(plane, version=V2, source=releases.url("badsum"))
    assert (status, body["error"]["type"]) == (502, "release_source")
    assert "is not the signed" in body["error"]["message"]
    status, body = await start(plane, version=V2, source=releases.url("elsewhere"))
    assert (status, body["error"]["type"]) == (409, "no_build")
    assert TAG in body["error"]["message"]
    for mode, words in (("garbage", "signature"), ("stall", "stalled")):
        releases.server.mode = mode
        status, body = await start(plane, version=V2, source=url)
        assert (status, body["error"]["type"]) == (502, "release_source"), body
        assert words in body["error"]["message"]
    releases.server.mode = "ok"
    await node(plane, "newer", "9.5.0", ["upgrade.v1"])
    status, body = await start(plane, version=V2, source=url)
    assert (status, body["error"]["type"]) == (409, "downgrade")
    assert "older than the cluster's 9.5.0" in body["error"]["message"]
    # A zipapp whose folder this user may not write (a container image's, as a non-root
    # user; this suite runs as root, whom permissions do not stop: os.access answers).
    with monkeypatch.context() as patched:
        patched.setattr(
            service_module.os,
            "access",
            lambda path, mode: Path(path) != bin_dir or mode != os.W_OK,
        )
        status, body = await start(plane, version=V2, source=url, downgrade=True)
    assert (status, body["error"]["type"]) == (409, "not_writable")
    assert "upgrade the image instead" in body["error"]["message"]
    monkeypatch.setattr(release, "running_zipapp", lambda argv0=None: None)
    status, body = await start(plane, version=V2, source=url, downgrade=True)
    assert (status, body["error"]["type"]) == (409, "not_zipapp")

    assert {p.name: digest(p) for p in bin_dir.iterdir()} == before  # no .part left either
    assert (await plane.client.get("/api/v1/upgrade")).status_code == 404


async def test_steps_skip_the_too_old_stop_at_a_refusal_and_the_same_version_resumes(
    plane: Plane, releases: Releases, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = plane.cp
    service = cp.upgrades.service
    old = await node(plane, "a-old", "0.1.0", [])
    b = await node(plane, "b", "0.1.0", ["upgrade.v1"])
    b.answer("upgrade", [failed("no room for the release in /opt/llmgw")])
    relaunched: list[str] = []
    service.relaunch = relaunched.append
    pyz = releases.root / "bin" / "llmgw.pyz"
    v1 = digest(pyz)

    status, run = await start(plane, version=V2, source=releases.url())
    assert status == 202, run
    check(admin.UpgradeJson, run)  # as the client reads it (routes.UPGRADE)
    assert [(s["kind"], s["target"]) for s in run["steps"]] == [
        ("control-plane", cp.ha.name),
        ("node", "a-old"),
        ("node", "b"),
    ]
    assert run["ready"] == {"a-old": 0, "b": 0}
    # 1. This control plane: swapped (the old kept), then started again.
    await service.advance()
    assert relaunched == [f"upgrade to {V2}"]
    assert digest(pyz) == digest(releases.root / "built" / "v2.pyz")
    assert digest(pyz.with_name(f"llmgw-{__version__}.pyz")) == v1
    assert service.run is not None and service.run.steps[0].detail.startswith("restarting")
    await service.advance()  # nothing more from this process
    assert service.run.steps[0].state == "running"
    # ... started again on the version: done once every Ready node is Ready again.
    service.relaunching = False
    monkeypatch.setattr(service_module, "__version__", V2)
    await service.advance()
    # 2. An agent that cannot be asked is skipped and named; 3. one that refuses stops it.
    await service.advance()
    await service.advance()
    await service.advance()
    shown = (await plane.client.get("/api/v1/upgrade")).json()
    check(admin.UpgradeJson, shown)  # routes.UPGRADE_STATUS
    assert shown["state"] == "failed"
    assert [s["state"] for s in shown["steps"]] == ["done", "skipped", "failed"]
    assert "cannot be upgraded over its stream" in shown["steps"][1]["detail"]
    assert shown["error"] == "node b refused: no room for the release in /opt/llmgw"
    assert old.kinds() == []
    asked = b.asked[0][1]
    assert asked["version"] == V2 and asked["source"] == releases.url()
    assert asked["asset"] == release.asset_name(V2)

    # The same version again: the failed node is asked again, the rest stay done.
    b.answer("upgrade", [ok({"version": V2, "restarting": True})])
    status, run = await start(plane, version=V2, source=releases.url())
    assert status == 202 and run["state"] == "running"
    assert [s["state"] for s in run["steps"]] == ["done", "skipped", "pending"]
    await service.advance()
    assert b.kinds() == ["upgrade", "upgrade"]
    assert service.run is not None and service.run.steps[2].state == "running"
    await service.advance()  # the old stream, the old version: not back yet
    assert service.run.steps[2].state == "running"
    await node(plane, "b", V2, ["upgrade.v1"])  # back on a new stream
    await service.advance()
    await service.advance()
    shown = (await plane.client.get("/api/v1/upgrade")).json()
    assert shown["state"] == "done" and shown["error"] is None
    assert shown["steps"][2]["detail"] == f"back on {V2}, Ready, 0 Ready replicas"
    assert relaunched == [f"upgrade to {V2}"]  # this control plane was not done again


async def test_a_node_not_back_in_time_fails_the_run_with_what_was_last_seen(
    plane: Plane, releases: Releases, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = plane.cp.upgrades.service
    now = [1000.0]
    service.clock = lambda: now[0]
    monkeypatch.setattr(service_module, "__version__", V2)  # this control plane is on it
    c = await node(plane, "c", "0.1.0", ["upgrade.v1"])
    c.answer("upgrade", [ok({"version": V2, "restarting": True})])
    d = await node(plane, "d", "0.1.0", ["upgrade.v1"])

    status, run = await start(plane, version=V2, source=releases.url(), node_timeout=30)
    assert status == 202, run
    for _ in range(3):  # this control plane (skipped), c asked
        await service.advance()
    assert c.kinds() == ["upgrade"]
    now[0] += 31
    await service.advance()
    shown = (await plane.client.get("/api/v1/upgrade")).json()
    assert shown["state"] == "failed"
    assert shown["error"] == (
        f"node c did not come back on {V2} within 30s "
        "(last seen: 0.1.0, Ready, connected, 0 of 0 Ready replicas)"
    )
    assert d.kinds() == []  # the next node untouched

    # Again, with more time: the node's wait starts anew, with the new limit.
    now[0] += 100
    status, run = await start(plane, version=V2, source=releases.url(), node_timeout=60)
    assert status == 202 and run["node_timeout"] == 60
    await service.advance()
    now[0] += 59
    await service.advance()
    assert c.kinds() == ["upgrade", "upgrade"]
    assert service.run is not None and service.run.state == "running"
    now[0] += 2
    await service.advance()
    assert service.run.state == "failed" and "within 60s" in str(service.run.error)


async def test_a_release_that_does_not_start_is_swapped_back_out(
    plane: Plane, releases: Releases
) -> None:
    service = plane.cp.upgrades.service
    service.relaunch = lambda why: pytest.fail(f"started again: {why}")
    pyz = releases.root / "bin" / "llmgw.pyz"
    before = {p.name: digest(p) for p in pyz.parent.iterdir()}

    status, run = await start(plane, version=V2, source=releases.url("dead"))
    assert status == 202, run  # its bytes are as signed
    await service.advance()
    shown = (await plane.client.get("/api/v1/upgrade")).json()
    assert shown["state"] == "failed"
    assert f"does not start as llmgw {V2} (exit 3" in shown["error"]
    assert "the old zipapp is back in place" in shown["error"]
    assert digest(pyz) == before["llmgw.pyz"]
    assert {p.name for p in pyz.parent.iterdir()} == set(before)
