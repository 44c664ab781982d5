"""The node converging on the fleet's engines from a loopback mirror of real archives:
the wanted version installed in the background with its progress said, versions no
longer named removed once no shard runs them, and the node standing apart (saying
why) where it does not manage an engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.engines.converge import STATE_FILE, EngineConvergence, load_wanted
from llmgw.agent.engines.install import LlamaCppInstaller
from llmgw.agent.engines.provision import NodeEngines
from llmgw.wire.messages import WantedEngines

from .conftest import FAKE_SERVER, Mirror, release_tar
from .test_ospackages import APT_GET, DPKG_QUERY, Machine


def asset(tag: str) -> str:
    return f"llama-{tag}-bin-ubuntu-x64.tar.gz"


async def no_missing_libraries(_: Path) -> str:
    return "\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for ``check`` to hold, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not so after {timeout} s")
        await asyncio.sleep(0.01)


class Counted(EngineConvergence):
    """Counts its finished passes (True: nothing left to do), so a test can show that
    something did not happen by looking after a pass that would have done it."""

    passes: list[bool]

    async def converge(self) -> bool:
        done = await super().converge()
        self.passes.append(done)
        return done


class Node:
    """One node's engines, its convergence, and what it said along the way."""

    def __init__(
        self,
        tmp_path: Path,
        mirror: Mirror,
        *,
        version: str | None = None,
        named: dict[str, str] | None = None,
        retry: float = 30.0,
    ) -> None:
        self.state_dir = tmp_path / "state"
        self.state_dir.mkdir(exist_ok=True)
        self.installer = LlamaCppInstaller(
            tmp_path / "engines",
            mirror.source,
            version,
            detect=lambda: "cpu",
            arch="x86_64",
            ldd=no_missing_libraries,
        )
        self.engines = NodeEngines(named, self.installer)
        self.busy: list[str] = []
        self.said: list[str] = []
        self.changes = 0
        self.conv = Counted(
            self.engines,
            self.state_dir,
            self.changed,
            self.in_use,
            said=self.heard,
            retry=retry,
        )
        self.conv.passes = []

    async def changed(self) -> None:
        self.changes += 1

    def in_use(self) -> Iterable[str]:
        return list(self.busy)

    def heard(self) -> None:
        self.said.append(self.conv.progress.get("llama.cpp", ""))

    def directory(self, tag: str) -> Path:
        return self.installer.directory(tag, "cpu")

    def has(self, tag: str) -> bool:
        return (self.directory(tag) / "installed.json").is_file()

    async def versions(self) -> list[str]:
        return [str(i.version) for i in await self.installer.installed()]

    def want(self, version: str, build: str = "auto", n: int = 1, **more: Any) -> None:
        engines = {"llama.cpp": {"version": version, "sha256": {}, "index_url": None, **more}}
        self.conv.want(WantedEngines(version=n, engines=engines, build=build))

    async def passed(self, count: int) -> None:
        await until(lambda: len(self.conv.passes) >= count)


@pytest.fixture
async def published(mirror: Mirror) -> Mirror:
    mirror.publish("b1", asset("b1"), release_tar())
    mirror.publish("b2", asset("b2"), release_tar())
    return mirror


@pytest.fixture
async def node(tmp_path: Path, published: Mirror) -> AsyncIterator[Node]:
    n = Node(tmp_path, published)
    try:
        yield n
    finally:
        await n.conv.close()


async def test_a_wish_is_installed_in_the_background_and_then_said_no_more(node: Node) -> None:
    node.want("b1")
    await node.passed(1)
    assert node.conv.passes == [True]
    assert node.has("b1") and await node.versions() == ["b1"]
    assert node.conv.progress == {}
    assert node.changes >= 2  # after the engine, and at the end of the pass
    # Said while it installed: each line its own, all of them "installing: ..."; the
    # installer's "installed ..." is not a line of progress (the pass clears it instead).
    assert node.said[0].startswith("installing: downloading llama-b1-bin-ubuntu-x64.tar.gz")
    assert all(w.startswith("installing") for w in node.said), node.said
    assert "installing: checking sha256" in node.said


async def test_the_same_wish_again_does_nothing_new(node: Node) -> None:
    node.want("b1", n=1)
    await node.passed(1)
    said = list(node.said)
    node.want("b1", n=2)  # the fleet's version moved, not its engines
    assert node.conv.wish is not None and node.conv.wish.version == 2
    node.want("b1", build="cpu", n=3)  # the build did: one more pass, nothing to install
    await node.passed(2)
    assert node.conv.passes == [True, True] and node.said == said


async def test_a_new_version_is_installed_and_the_old_removed(node: Node) -> None:
    node.want("b1")
    await node.passed(1)
    node.want("b2", n=2)
    await until(lambda: node.has("b2") and not node.directory("b1").exists())
    await node.passed(2)
    assert await node.versions() == ["b2"]
    assert node.conv.progress == {}
    assert sorted(p.name for p in node.directory("b2").parent.iterdir()) == ["b2-cpu"]


async def test_an_old_version_in_use_is_kept_until_its_shard_stops(node: Node) -> None:
    node.want("b1")
    await node.passed(1)
    node.busy = [str(node.directory("b1") / "build" / "bin" / "llama-server")]
    node.want("b2", n=2)
    await until(lambda: len(node.conv.passes) >= 2)
    assert node.conv.passes == [True, True]
    assert await node.versions() == ["b2", "b1"]  # b1 still runs a shard: kept
    node.conv.poke()  # nothing changed yet: still kept
    await node.passed(3)
    assert node.has("b1")

    node.busy = []  # its shard stopped
    node.conv.poke()
    await until(lambda: not node.directory("b1").exists())
    assert await node.versions() == ["b2"]


async def test_a_pinned_digest_that_does_not_match_fails_and_keeps_the_old(
    node: Node,
) -> None:
    node.want("b1")
    await node.passed(1)
    node.want("b2", n=2, sha256={asset("b2"): "0" * 64})
    await node.passed(2)
    assert node.conv.passes == [True, False]
    words = node.conv.progress["llama.cpp"]
    assert words.startswith("install failed:") and "sha256" in words
    assert "pinned " + "0" * 64 in words
    assert not node.has("b2") and await node.versions() == ["b1"]


async def test_a_failure_is_tried_again_later(tmp_path: Path, mirror: Mirror) -> None:
    node = Node(tmp_path, mirror, retry=0.05)
    try:
        node.want("b1")  # not published yet
        await node.passed(1)
        assert node.conv.passes == [False]
        assert node.conv.progress["llama.cpp"].startswith("install failed:")
        assert "HTTP 404" in node.conv.progress["llama.cpp"]
        mirror.publish("b1", asset("b1"), release_tar())
        await until(lambda: node.conv.passes[-1] is True)
        assert node.has("b1") and node.conv.progress == {}
    finally:
        await node.conv.close()


async def test_an_engines_os_packages_come_first_and_their_failure_is_said(
    tmp_path: Path, published: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    debian = Machine(tmp_path / "os", {"apt-get": APT_GET, "dpkg-query": DPKG_QUERY}, monkeypatch)
    debian.mode("offline")
    node = Node(tmp_path, published, retry=0.05)
    node.conv.packages = debian.packages()
    try:
        node.want("b1", packages={"apt": ["libgomp1"]})
        await node.passed(1)
        words = node.conv.progress["llama.cpp"]
        assert words.startswith("install failed: llama.cpp needs the OS package(s) libgomp1")
        assert "`sudo apt-get install -y libgomp1`" in words
        assert not node.has("b1")  # the engine waits for what it needs
        # The package sources answer again: the next try installs both.
        debian.mode("ok")
        await until(lambda: node.conv.passes[-1] is True)
        assert (debian.state / "libgomp1").exists() and node.has("b1")
        assert "installing OS package(s) libgomp1 with apt-get" in node.said
    finally:
        await node.conv.close()


async def test_a_new_wish_after_a_failure_is_not_kept_waiting(node: Node) -> None:
    node.want("b9")  # no such release; the next try would be 30 s away
    await node.passed(1)
    assert node.conv.progress["llama.cpp"].startswith("install failed:")
    node.want("b1", n=2)
    await until(lambda: node.has("b1") and node.conv.progress == {})


async def test_build_none_installs_nothing_and_says_why(node: Node) -> None:
    node.want("b1", build="none")
    await node.passed(1)
    assert node.conv.passes == [True]
    assert "build is none" in node.conv.progress["llama.cpp"]
    assert await node.versions() == [] and not node.installer.root.exists()


async def test_an_engine_named_on_purpose_is_not_managed(tmp_path: Path, published: Mirror) -> None:
    path = tmp_path / "llama-server"
    path.write_text(FAKE_SERVER)
    path.chmod(0o755)
    node = Node(tmp_path, published, named={"llama.cpp": str(path)})
    try:
        node.want("b1")
        await node.passed(1)
        assert node.conv.passes == [True]
        words = node.conv.progress["llama.cpp"]
        assert "named to this node on purpose" in words and str(path) in words
        assert "not managed" in words
        assert not node.installer.root.exists()
    finally:
        await node.conv.close()


async def test_a_version_pinned_in_agent_settings_stands_apart(
    tmp_path: Path, published: Mirror
) -> None:
    node = Node(tmp_path, published, version="1")  # llamacpp_version: 1, that is b1
    try:
        node.want("b2")
        await node.passed(1)
        assert node.conv.passes == [True]
        assert node.conv.progress["llama.cpp"] == (
            "pinned in this node's settings to b1 (llamacpp_version)"
        )
        assert not node.installer.root.exists()
        # The fleet comes round to the node's own: installed as any other.
        node.want("1", n=2)
        await node.passed(2)
        assert node.has("b1") and node.conv.progress == {}
    finally:
        await node.conv.close()


async def test_engines_this_agent_does_not_install_are_said(node: Node) -> None:
    engines: dict[str, dict[str, Any]] = {
        "llama.cpp": {"version": "b1", "sha256": {}, "index_url": None},
        "vllm": {"version": "0.11.0", "sha256": {}, "index_url": None},
    }
    node.conv.want(WantedEngines(version=1, engines=engines))
    await node.passed(1)
    assert node.conv.progress == {"vllm": "this agent does not install vllm"}
    assert node.has("b1")


async def test_the_wish_is_kept_in_the_state_dir(node: Node) -> None:
    assert load_wanted(node.state_dir) is None
    node.want("b1", build="cpu", n=7)
    kept = load_wanted(node.state_dir)
    assert kept == {
        "version": 7,
        "engines": {"llama.cpp": {"version": "b1", "sha256": {}, "index_url": None}},
        "build": "cpu",
    }
    assert json.loads((node.state_dir / STATE_FILE).read_text()) == kept
    assert [p.name for p in node.state_dir.iterdir()] == [STATE_FILE]  # no temporary left
    await node.passed(1)


def test_a_wish_not_kept_or_not_readable_is_none(tmp_path: Path) -> None:
    assert load_wanted(tmp_path) is None
    (tmp_path / STATE_FILE).write_text("{not json")
    assert load_wanted(tmp_path) is None
    (tmp_path / STATE_FILE).write_text("[1, 2]")
    assert load_wanted(tmp_path) is None
    assert load_wanted(tmp_path / "missing") is None


async def test_in_use_is_seen_through_a_symlinked_install_root(
    tmp_path: Path, published: Mirror
) -> None:
    """A state dir reached through a link (/var/lib/llmgw -> /data/llmgw): a shard
    started from a binary just installed runs it by the linked path, and that is the
    directory's all the same; it must not be removed under the shard."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    node = Node(tmp_path / "link", published)
    try:
        # Started as the supervisor starts a shard: from what ensure gave it.
        info = await node.engines.ensure("llama.cpp", lambda words: None, "b1")
        assert info.path.startswith(str(tmp_path / "link"))
        node.busy = [info.path]
        node.want("b2")
        await node.passed(1)
        assert node.has("b2") and (real / "engines" / "llama.cpp" / "b1-cpu").is_dir()
        node.busy = []
        node.conv.poke()
        await until(lambda: not (real / "engines" / "llama.cpp" / "b1-cpu").exists())
    finally:
        await node.conv.close()
