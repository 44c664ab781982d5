"""vLLM, SGLang, FreeToken and TensorRT-LLM installed by the node itself, each version
into its own virtual environment made with uv, and the installs already there, checked
again.

The node makes a virtual environment with ``uv venv`` (this agent's own Python, never
one uv would download), installs ``{package}=={version}`` into it with ``uv pip
install --torch-backend`` so PyTorch comes in the build the node chose (``auto``
lets uv read the NVIDIA driver; ``cu13``, ``cu129`` and ``cpu`` pin it), runs the
engine's own version command, and on a node with NVIDIA cards has the environment's
PyTorch see them. Only then is ``installed.json`` written. A directory without that
marker is not installed and is never read.

Layout: ``{install_root}/{engine}/{version}-{build}/`` holds the environment in
``venv/`` and the marker; an install under way is dot-named beside it and moved into
place once it has been seen to run. The environment is made relocatable, so its
scripts still run after the move. uv's cache is ``{install_root}/.uv-cache``.

Time: ``timeout`` (an hour by default) bounds uv's work, making the environment and
downloading and installing, which is where an install can hang; uv is killed when it
runs out. The checks after it have limits of their own (the version command's 30s,
PyTorch's look at the cards 300s).

The network is reached only by uv: from PyPI, or from ``index_url`` when one is set
(which replaces PyPI), and for PyTorch from the PyTorch index its backend names.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypedDict

from llmgw.agent.command import end
from llmgw.agent.engines import adapter
from llmgw.agent.engines.base import EngineError
from llmgw.agent.engines.install import (
    DRIVER_VERSION,
    MARKER,
    REPORT_EVERY,
    InstallError,
    marked,
)
from llmgw.agent.engines.verify import EngineCheckError, run_output, seen_to_run
from llmgw.wire.messages import EngineInfo

BUILDS = ("auto", "cu13", "cu129", "cpu")
TORCH_BACKEND = {"auto": "auto", "cu13": "cu130", "cu129": "cu129", "cpu": "cpu"}
PACKAGES = {
    "vllm": "vllm",
    "sglang": "sglang",
    "freetoken": "freetoken",
    "tensorrt-llm": "tensorrt-llm",
}
# The file in the environment each adapter's command() takes as its binary.
ENTRY_POINTS = {
    "vllm": "vllm",
    "sglang": "python",
    "freetoken": "ft",
    "tensorrt-llm": "trtllm-serve",
}
UV_TORCH_BACKEND = (0, 6, 9)  # the first uv with --torch-backend
CUDA_CHECK = "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 3)"
CUDA_TIMEOUT = 300.0  # importing PyTorch and starting CUDA on a busy node is slow
# uv's lines saying where it works, not what it does: neither progress nor a reason.
_UV_CHATTER = ("Using ", "Creating virtual environment at", "Activate with")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*\Z")


class PythonInstallMarker(TypedDict):
    """``installed.json``, written last into an environment: what it holds, from where."""

    engine: str
    version: str
    build: str
    path: str  # the entry point
    package: str
    index_url: str | None
    torch_backend: str
    reported_version: str | None
    installed_at: float


def find_uv() -> str | None:
    """``uv`` beside this Python (the agent's virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


def _has_card() -> bool:
    return DRIVER_VERSION.exists()


def _quiet(words: str) -> None:
    pass


def _public(version: str) -> str:
    """A version without its local part: ``0.11.0+cu129`` is ``0.11.0``."""
    return version.split("+", 1)[0]


def _version_order(name: str) -> tuple[tuple[int, ...], int, str]:
    """A directory's name in version order: releases by number, a pre-release before
    its final release."""
    m = re.match(r"(\d+(?:\.\d+)*)(.*)", name.rsplit("-", 1)[0])
    if not m:
        return ((), 0, name)
    final = 1 if not m[2] or m[2].startswith(("+", ".post")) else 0
    return (tuple(int(n) for n in m[1].split(".")), final, m[2])


class PythonEngineInstaller:
    """Installs versions of one Python engine (vLLM, SGLang, FreeToken, TensorRT-LLM)
    and lists the installs."""

    def __init__(
        self,
        install_root: Path,
        engine: str,
        *,
        index_url: str | None = None,
        uv: str | None = None,
        python: str | None = None,
        progress: Callable[[str], None] = _quiet,
        has_card: Callable[[], bool] = _has_card,
        timeout: float = 3600,
    ) -> None:
        if engine not in PACKAGES:
            raise ValueError(f"no Python install is known for {engine!r}")
        self.install_root = install_root
        self.engine = engine
        self.root = install_root / engine
        self.package = PACKAGES[engine]
        self.adapter = adapter(engine)
        self.index_url = index_url
        self.uv = uv
        self.python = python or sys.executable
        self.progress = progress
        self.has_card = has_card
        self.timeout = timeout
        # What each install directory's last check found wrong, for the node to show.
        self.problems: dict[str, str] = {}
        self._uv_checked: str | None = None
        self._lock = asyncio.Lock()

    def directory(self, version: str, build: str) -> Path:
        return self.root / f"{version}-{build}"

    def entry_point(self, directory: Path) -> Path:
        return directory / "venv" / "bin" / ENTRY_POINTS[self.engine]

    def check_request(self, version: str, build: str) -> None:
        """Refuse a version or build that is not one, naming it, before anything runs."""
        if not _VERSION.match(version):
            raise InstallError(
                f"{version!r} is not a {self.engine} version (a release number like 0.11.0)"
            )
        if build not in BUILDS:
            raise InstallError(f"{build!r} is not a build; pick one of {', '.join(BUILDS)}")

    # --- what is installed ------------------------------------------------------------

    async def installed(self) -> list[EngineInfo]:
        """Every marked install that still runs, newest first. One that no longer runs
        (its environment changed or removed since) is left out, its reason in
        ``problems``."""
        found: list[EngineInfo] = []
        for directory in marked(self.root, _version_order):
            info = await self._recheck(directory)
            if info is not None:
                found.append(info)
        return found

    async def _recheck(self, directory: Path) -> EngineInfo | None:
        try:
            marker: PythonInstallMarker = json.loads((directory / MARKER).read_text())
            version, build = str(marker["version"]), str(marker["build"])
            if marker["engine"] != self.engine or directory.name != f"{version}-{build}":
                raise InstallError(f"its marker is for {marker['engine']} {version}-{build}")
            entry = self.entry_point(directory)
            await self._check_version(entry, version)
        except (OSError, ValueError, KeyError, TypeError, InstallError, EngineCheckError) as e:
            reason = f"{self.engine} in {directory.name} no longer runs: {e}"
            if self.problems.get(directory.name) != reason:
                self.progress(reason)
            self.problems[directory.name] = reason
            return None
        self.problems.pop(directory.name, None)
        return EngineInfo(
            name=self.engine, path=str(entry), version=version, build=build, origin="installed"
        )

    async def ensure(
        self, version: str, build: str, progress: Callable[[str], None] | None = None
    ) -> EngineInfo:
        """That version in that build: the install already there when it still runs,
        otherwise installed now (replacing one that no longer runs)."""
        report = progress or self.progress
        try:
            self.check_request(version, build)
        except InstallError as exc:
            report(f"install failed: {exc}")
            raise
        async with self._lock:  # several shards asking at once make one install
            directory = self.directory(version, build)
            if (directory / MARKER).is_file():
                info = await self._recheck(directory)
                if info is not None:
                    return info
            return await self._install(version, build, report)

    def remove(self, version: str, build: str) -> bool:
        """Delete that install's directory; True when there was one."""
        self.check_request(version, build)
        directory = self.directory(version, build)
        if not directory.exists():
            return False
        (directory / MARKER).unlink(missing_ok=True)  # not installed from here on
        shutil.rmtree(directory)
        self.problems.pop(directory.name, None)
        return True

    # --- installing -------------------------------------------------------------------

    async def _install(self, version: str, build: str, report: Callable[[str], None]) -> EngineInfo:
        directory = self.directory(version, build)
        staging = directory.with_name(f".{directory.name}.installing")
        try:
            deadline = asyncio.get_running_loop().time() + self.timeout
            return await self._install_steps(version, build, staging, deadline, report)
        except (InstallError, EngineCheckError, EngineError) as exc:
            reason = str(exc)
        except TimeoutError:
            reason = (
                f"installing {self.engine} {version} did not finish in {self.timeout:.0f}s; "
                "check this node's connection to the package index and try again"
            )
        except OSError as exc:
            reason = f"{exc.strerror or exc}: {exc.filename or self.root}"
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        report(f"install failed: {reason}")
        raise InstallError(reason)

    async def _install_steps(
        self,
        version: str,
        build: str,
        staging: Path,
        deadline: float,
        report: Callable[[str], None],
    ) -> EngineInfo:
        uv = await self._find_uv()
        said = f"installing: {self.engine} {version}: "
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.rmtree, staging, True)  # a crashed install's leftovers
        venv = staging / "venv"
        report(f"{said}making its environment")
        argv = [uv, "venv", "--relocatable", "--python", self.python, str(venv)]
        await self._run_uv(argv, "make the environment", said, deadline, report)
        requirement = f"{self.package}=={version}"
        argv = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), requirement]
        argv += ["--torch-backend", TORCH_BACKEND[build]]
        if self.index_url:
            argv += ["--index-url", self.index_url]
        report(f"{said}uv pip install {requirement} ({build})")
        await self._run_uv(argv, f"install {requirement}", said, deadline, report)
        report(f"{said}running its version command")
        await self._check_version(self.entry_point(staging), version)
        if self.has_card():
            report(f"{said}checking that PyTorch sees this node's cards")
            await self._check_cuda(venv / "bin" / "python", build)
        directory = self.directory(version, build)
        await asyncio.to_thread(_move_into_place, staging, directory)
        entry = self.entry_point(directory)
        reported = await self._check_version(entry, version)  # still runs where it lies
        marker: PythonInstallMarker = {
            "engine": self.engine,
            "version": version,
            "build": build,
            "path": str(entry),
            "package": self.package,
            "index_url": self.index_url,
            "torch_backend": TORCH_BACKEND[build],
            "reported_version": reported,
            "installed_at": time.time(),
        }
        await asyncio.to_thread(_write_marker, directory, marker)
        self.problems.pop(directory.name, None)
        report(f"installed {self.engine} {version} ({build})")
        return EngineInfo(
            name=self.engine, path=str(entry), version=version, build=build, origin="installed"
        )

    async def _find_uv(self) -> str:
        """The uv to use, once checked to know ``--torch-backend``."""
        uv = self.uv or find_uv()
        if uv is None or not (os.path.isfile(uv) and os.access(uv, os.X_OK)):
            where = f" ({uv} is not there)" if uv else ""
            raise InstallError(
                f"installing {self.engine} needs uv{where}; install uv on this node: "
                "pip install uv, or your distribution's package"
            )
        if self._uv_checked == uv:
            return uv
        code, output = await run_output([uv, "--version"])
        m = re.search(r"\buv (\d+)\.(\d+)\.(\d+)", output)
        if code != 0 or m is None:
            raise InstallError(f"{uv} --version failed (exit {code}): {output.strip()[-200:]}")
        if tuple(int(n) for n in m.groups()) < UV_TORCH_BACKEND:
            raise InstallError(
                f"{uv} is uv {'.'.join(m.groups())}, which has no --torch-backend; "
                "upgrade it to 0.6.9 or later: pip install -U uv"
            )
        self._uv_checked = uv
        return uv

    def _uv_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["UV_PYTHON_DOWNLOADS"] = "never"
        env["UV_CACHE_DIR"] = str(self.install_root / ".uv-cache")
        env["NO_COLOR"] = "1"
        env.pop("FORCE_COLOR", None)
        return env

    async def _run_uv(
        self,
        argv: list[str],
        doing: str,
        said: str,
        deadline: float,
        report: Callable[[str], None],
    ) -> None:
        """Run uv, passing its lines on as progress words, one every REPORT_EVERY
        seconds at most (the newest held back until its turn, so a long download is
        named while it runs), killed at ``deadline``; InstallError with its last lines
        when it fails."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._uv_env(),
            limit=1 << 20,
            start_new_session=True,  # killed with its builds (command.end)
        )
        assert proc.stdout is not None
        loop = asyncio.get_running_loop()
        last_said = -REPORT_EVERY
        pending: str | None = None  # a line held back, said when its turn comes
        tail: deque[str] = deque(maxlen=3)
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    wait = None if pending is None else last_said + REPORT_EVERY - loop.time()
                    try:
                        raw = await asyncio.wait_for(proc.stdout.readline(), wait)
                    except TimeoutError:
                        raw = None
                    if raw == b"":
                        break
                    line = raw.decode(errors="replace").strip() if raw else ""
                    if line and not line.startswith(_UV_CHATTER):
                        tail.append(line)
                        pending = line
                    if pending is not None and loop.time() - last_said >= REPORT_EVERY:
                        last_said = loop.time()
                        report(said + pending)
                        pending = None
                code = await proc.wait()
        finally:
            # Killed and reaped even while this install is being cancelled.
            await end(proc)
        if code != 0:
            raise InstallError(f"uv could not {doing} (exit {code}): {' | '.join(tail)}")

    async def _check_version(self, entry: Path, version: str) -> str | None:
        """Run the engine's version command; InstallError unless it names ``version``."""
        reported, _ = await seen_to_run(self.adapter, str(entry))
        if reported is None or _public(reported) != _public(version):
            raise InstallError(
                f"{self.engine} {version} was asked for, but the installed one says it is "
                f"{reported or 'no version'}"
            )
        return reported

    async def _check_cuda(self, python: Path, build: str) -> None:
        code, output = await run_output([str(python), "-c", CUDA_CHECK], CUDA_TIMEOUT)
        if code != 0:
            last = [line for line in output.splitlines() if line.strip()][-1:]
            why = "PyTorch sees no card" if code == 3 else " | ".join(last) or f"exit {code}"
            raise InstallError(
                f"the {build} build of {self.engine} cannot use this node's cards ({why}); "
                "pick another build with `llmgw ctl engine-build NODE cu129` (or cpu)"
            )


def _move_into_place(staging: Path, directory: Path) -> None:
    if directory.exists():
        (directory / MARKER).unlink(missing_ok=True)  # not installed from here on
        shutil.rmtree(directory)
    staging.rename(directory)


def _write_marker(directory: Path, marker: Mapping[str, object]) -> None:
    tmp = directory / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.rename(directory / MARKER)
