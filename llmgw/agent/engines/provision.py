"""The engines this node can run: those named to it on purpose (agent.yaml ``engines:``
or ``--engine NAME=PATH``), each seen to run before it is reported, and llama.cpp as
the node installs it. Never anything merely found on PATH.

``NodeEngines`` is what the supervisor asks (``ensure``) before it starts a shard, and
what the session reports (``probe``, every 10 minutes and at registration).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from llmgw.agent.engines import adapter
from llmgw.agent.engines.base import EngineError
from llmgw.agent.engines.install import InstallError, LlamaCppInstaller
from llmgw.agent.engines.pyinstall import BUILDS, PythonEngineInstaller
from llmgw.agent.engines.verify import EngineCheckError, seen_to_run
from llmgw.enginepins import EngineWant
from llmgw.wire.messages import EngineInfo


async def configured(path: str, name: str = "llama.cpp") -> EngineInfo:
    """An engine named on purpose, once seen to run (its version command exits 0);
    EngineError with what went wrong otherwise. ``path`` is llama-server, the ``vllm``
    entry point, or SGLang's Python."""
    engine = adapter(name)
    # Reported and later run from wherever the agent's working directory is then.
    path = os.path.abspath(path)
    try:
        version, _ = await seen_to_run(engine, path)
    except EngineCheckError as exc:
        raise EngineError(
            f"{name} at {path} was named to this node but does not run: {exc}"
        ) from exc
    return EngineInfo(name=name, path=path, version=version, build=None, origin="configured")


def parse_engine_option(value: str) -> tuple[str, str]:
    """``--engine llama.cpp=/path/to/llama-server`` as (name, path)."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise EngineError(
            f"--engine takes NAME=PATH (llama.cpp=/usr/local/bin/llama-server), not {value!r}"
        )
    adapter(name)  # an unknown name fails here, naming the known ones
    return name, path


class NodeEngines:
    """The node's engines: configured ones first, then the node's own installs."""

    def __init__(
        self,
        named: Mapping[str, str] | None = None,
        llamacpp: LlamaCppInstaller | None = None,
        python: Mapping[str, PythonEngineInstaller] | None = None,
    ) -> None:
        self.named = dict(named or {})
        self.llamacpp = llamacpp
        # vLLM and SGLang, installed with uv into their own environments.
        self.python = dict(python or {})
        # What the fleet wants ({engine: {"version", "sha256", "index_url"}}) and this
        # node's build choice: a shard asking no version runs the fleet's.
        self.wanted: dict[str, EngineWant] = {}
        self.build = "auto"
        # False until probe() has run: until then an empty list says nothing.
        self.probed = False
        # Why a named engine is not reported, by name, for the node to show.
        self.problems: dict[str, str] = {}

    @property
    def installable(self) -> list[str]:
        """What this agent can install when asked: Register.installable_engines."""
        found = ["llama.cpp"] if self.llamacpp is not None else []
        return found + sorted(self.python)

    async def probe(self) -> list[EngineInfo]:
        """Every engine that runs now: named ones run again, installs re-checked."""
        found: list[EngineInfo] = []
        for name, path in sorted(self.named.items()):
            try:
                found.append(await configured(path, name))
                self.problems.pop(name, None)
            except EngineError as exc:
                self.problems[name] = str(exc)
        if self.llamacpp is not None and "llama.cpp" not in self.named:
            found.extend(await self.llamacpp.installed())
        for name, installer in sorted(self.python.items()):
            if name not in self.named:
                found.extend(await installer.installed())
        self.probed = True
        return found

    async def ensure(
        self, name: str, report: Callable[[str], None], version: str | None = None
    ) -> EngineInfo:
        """The engine to start a shard with, installed first if this node installs it;
        EngineError with the node's reason when there is none. ``version`` is the one
        the shard asks (the fleet's); without one the node's own choice, then the
        fleet's, then any install there."""
        if name in self.named:
            return await configured(self.named[name], name)
        want = self.wanted.get(name) or EngineWant()
        if name == "llama.cpp" and self.llamacpp is not None:
            version = version or self.llamacpp.version or want.get("version")
            pins = want.get("sha256") if want.get("version") == version else None
            try:
                return await self.llamacpp.ensure(
                    report, version=version, build=llamacpp_build(self.build), pins=pins
                )
            except InstallError as exc:
                raise EngineError(f"llama.cpp could not be installed: {exc}") from exc
        installer = self.python.get(name)
        version = version or want.get("version")
        if installer is not None and version:
            try:
                return await installer.ensure(version, python_build(self.build), report)
            except InstallError as exc:
                raise EngineError(f"{name} {version} could not be installed: {exc}") from exc
        adapter(name)
        raise EngineError(
            f"{name} is not on this node: the fleet names no version of it (llmgw ctl "
            f"engines set {name} VERSION), or name it in agent.yaml (engines: {{{name}: PATH}}) "
            f"or run the agent with --engine {name}=PATH"
        )


def llamacpp_build(build: str) -> str | None:
    """llama.cpp's archive build for a node's choice: ``cpu``, ``cuda``, or None to
    detect (a loaded NVIDIA driver means cuda)."""
    return {"cpu": "cpu", "cu129": "cuda", "cu13": "cuda"}.get(build)


def python_build(build: str) -> str:
    """vLLM's and SGLang's build (uv's PyTorch backend) for a node's choice."""
    return build if build in BUILDS else "auto"
