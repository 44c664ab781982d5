"""The node converging on the engines the fleet wants (a ``WantedEngines`` message):
each named version installed in the background, its progress reported in the node's
own words, and the versions no longer named removed once the named one runs and no
shard runs them.

Per engine, what converging is doing is one line in ``progress``: ``installing: ...``
while it installs, ``install failed: ...`` when it could not (tried again later, sooner
when the fleet's wish changes), or why the node stands apart (an engine named to it on
purpose, a version pinned in its agent.yaml, the build ``none``). An engine absent from
``progress`` is there. The control plane shows these lines, and a placement refused
meanwhile carries them.

The last wish is kept in the state dir (``engines-wanted.json``) so doctor can compare
what the node has with what the fleet wants without asking the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TypedDict

from llmgw.agent.engines.base import EngineError
from llmgw.agent.engines.install import InstallError, release_tag
from llmgw.agent.engines.ospackages import OsPackages
from llmgw.agent.engines.provision import NodeEngines, llamacpp_build, python_build
from llmgw.enginepins import EngineWant, want_of
from llmgw.jsonvalue import JSON
from llmgw.wire.messages import EngineInfo, WantedEngines

log = logging.getLogger("llmgw.agent.engines")

STATE_FILE = "engines-wanted.json"
RETRY_FIRST = 30.0
RETRY_MAX = 600.0


class KeptWish(TypedDict):
    """``engines-wanted.json``: the fleet's last ``WantedEngines`` as this node kept it."""

    version: int
    engines: dict[str, EngineWant]
    build: str


def load_wanted(state_dir: Path) -> KeptWish | None:
    """The fleet's last wish as this node kept it; None when it has heard none."""
    try:
        doc: JSON = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    version, engines, build = doc.get("version"), doc.get("engines"), doc.get("build")
    return {
        "version": version if isinstance(version, int) else 0,
        "engines": {
            name: want_of(want)
            for name, want in (engines.items() if isinstance(engines, dict) else ())
            if isinstance(want, dict)
        },
        "build": build if isinstance(build, str) else "auto",
    }


class EngineConvergence:
    def __init__(
        self,
        engines: NodeEngines,
        state_dir: Path,
        changed: Callable[[], Coroutine[Any, Any, None]],
        in_use: Callable[[], Iterable[str]] = tuple,
        *,
        said: Callable[[], None] = lambda: None,
        retry: float = RETRY_FIRST,
        packages: OsPackages | None = None,
    ) -> None:
        self.engines = engines
        self.state_dir = state_dir
        # ``changed`` looks at the installs again and reports them; ``said`` reports
        # only a new line of progress.
        self.changed = changed
        self.said = said
        # Paths of what running shards were started from (binaries, interpreters).
        self.in_use = in_use
        self.retry = retry
        # The engines' OS packages, from the machine's own package sources.
        self.packages = packages or OsPackages()
        self.progress: dict[str, str] = {}
        self.wish: WantedEngines | None = None
        self._task: asyncio.Task[None] | None = None
        self._again = asyncio.Event()

    def want(self, msg: WantedEngines) -> None:
        """The fleet's wish (after every Register and on every change)."""
        if self.wish is not None and (msg.engines, msg.build) == (
            self.wish.engines,
            self.wish.build,
        ):
            self.wish = msg
            return
        self.wish = msg
        self.engines.wanted = {k: want_of(v) for k, v in msg.engines.items()}
        self.engines.build = msg.build
        with contextlib.suppress(OSError):
            doc = {"version": msg.version, "engines": msg.engines, "build": msg.build}
            tmp = self.state_dir / f".{STATE_FILE}.tmp"
            tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            tmp.rename(self.state_dir / STATE_FILE)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        self._again.set()

    def poke(self) -> None:
        """A shard stopped: a version it held may be removable now."""
        if self.wish is not None and self._task is not None and not self._task.done():
            self._again.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.retry
        while True:
            self._again.clear()
            try:
                done = await self.converge()
            except Exception:
                log.exception("converging on the fleet's engines failed; trying again")
                done = False
            if done:
                delay = self.retry
                await self._again.wait()
                continue
            # Something could not be installed: again later, or at once on a new wish.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._again.wait(), delay)
            delay = min(delay * 2, RETRY_MAX)

    async def converge(self) -> bool:
        """One pass: every named engine installed (or why not), then the versions no
        longer named removed. True when nothing is left to do."""
        wish = self.wish
        if wish is None:
            return True
        complete = True
        for name, asked in sorted(wish.engines.items()):
            want = want_of(asked)
            version = str(want.get("version"))
            apart = self._apart(name, version, wish.build)
            if apart is not None:
                self._say(name, apart)
                continue
            try:
                await self._install(name, want, wish.build)
            except (InstallError, EngineError) as exc:
                words = str(exc)
                failed = words if words.startswith("install failed") else f"install failed: {words}"
                self._say(name, failed)
                complete = False
                await self.changed()
                continue
            self.progress.pop(name, None)
            if await self._tidy(name, version):
                log.info("removed the %s versions the fleet no longer names", name)
            await self.changed()
        await self.changed()
        return complete

    def _apart(self, name: str, version: str, build: str) -> str | None:
        """Why this node does not install ``name`` itself, or None when it does."""
        engines = self.engines
        if name in engines.named:
            return f"named to this node on purpose ({engines.named[name]}); not managed"
        if build == "none":
            return "this node's build is none: it installs no engines (llmgw ctl engine-build)"
        if name == "llama.cpp":
            if engines.llamacpp is None:
                return "this agent does not install llama.cpp"
            pinned = engines.llamacpp.version
            if pinned and pinned != release_tag(version):
                return f"pinned in this node's settings to {pinned} (llamacpp_version)"
        elif name not in engines.python:
            return f"this agent does not install {name}"
        return None

    async def _install(self, name: str, want: EngineWant, build: str) -> EngineInfo:
        report = self._reporter(name)
        version = str(want["version"])
        # What the engine needs from the OS first: its check after install runs it.
        await self.packages.ensure(name, want.get("packages") or {}, report)
        if name == "llama.cpp":
            assert self.engines.llamacpp is not None
            return await self.engines.llamacpp.ensure(
                report,
                version=version,
                build=llamacpp_build(build),
                pins=want.get("sha256") or {},
            )
        installer = self.engines.python[name]
        if want.get("index_url"):
            installer.index_url = str(want["index_url"])
        return await installer.ensure(version, python_build(build), report)

    def _reporter(self, name: str) -> Callable[[str], None]:
        def report(words: str) -> None:
            if words.startswith("installed "):
                return  # done: the pass clears the line and reports the install itself
            self._say(name, words)
            self.said()

        return report

    def _say(self, name: str, words: str) -> None:
        if self.progress.get(name) != words:
            log.info("%s: %s", name, words)
        self.progress[name] = words

    async def _tidy(self, name: str, keep: str) -> bool:
        """Remove ``name``'s installs other than ``keep`` that no running shard uses."""
        busy = [Path(p) for p in self.in_use()]
        removed = False
        if name == "llama.cpp" and self.engines.llamacpp is not None:
            installer = self.engines.llamacpp
            keep = release_tag(keep)
            for info in await installer.installed():
                if info.version == keep or info.build is None:
                    continue
                directory = installer.directory(str(info.version), info.build)
                if not _used(directory, busy):
                    removed |= await installer.remove(str(info.version), info.build)
        elif name in self.engines.python:
            python = self.engines.python[name]
            for info in await python.installed():
                if info.version == keep or info.build is None:
                    continue
                directory = python.directory(str(info.version), info.build)
                if not _used(directory, busy):
                    removed |= python.remove(str(info.version), info.build)
        return removed


def _used(directory: Path, busy: list[Path]) -> bool:
    root = directory.resolve()
    return any(p == root or root in p.parents for p in (b.resolve() for b in busy))
