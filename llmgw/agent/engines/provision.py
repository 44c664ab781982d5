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
from llmgw.agent.engines.verify import EngineCheckError, seen_to_run
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
    """The node's engines: configured ones first, then llama.cpp's installs."""

    def __init__(
        self,
        named: Mapping[str, str] | None = None,
        llamacpp: LlamaCppInstaller | None = None,
    ) -> None:
        self.named = dict(named or {})
        self.llamacpp = llamacpp
        # False until probe() has run: until then an empty list says nothing.
        self.probed = False
        # Why a named engine is not reported, by name, for the node to show.
        self.problems: dict[str, str] = {}

    @property
    def installable(self) -> list[str]:
        """What this agent can install when asked: Register.installable_engines."""
        return ["llama.cpp"] if self.llamacpp is not None else []

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
        self.probed = True
        return found

    async def ensure(self, name: str, report: Callable[[str], None]) -> EngineInfo:
        """The engine to start a shard with, installed first if this node installs it;
        EngineError with the node's reason when there is none."""
        if name in self.named:
            return await configured(self.named[name], name)
        if name == "llama.cpp" and self.llamacpp is not None:
            try:
                return await self.llamacpp.ensure(report)
            except InstallError as exc:
                raise EngineError(f"llama.cpp could not be installed: {exc}") from exc
        adapter(name)
        raise EngineError(
            f"{name} is not on this node: this agent does not install it; name it in "
            f"agent.yaml (engines: {{{name}: PATH}}) or run the agent with --engine {name}=PATH"
        )
