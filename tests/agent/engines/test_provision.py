"""Engines named on purpose are reported only once seen to run; the node's engines
together: what it reports, and what it gives the supervisor to start a shard with."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.engines import EngineError
from llmgw.agent.engines.install import LlamaCppInstaller
from llmgw.agent.engines.provision import NodeEngines, configured, parse_engine_option
from llmgw.wire.messages import EngineInfo

from .conftest import BROKEN_SERVER, FAKE_SERVER, Mirror, release_tar


def script(tmp_path: Path, text: str, name: str = "llama-server") -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


async def test_configured_engine_is_seen_to_run(tmp_path: Path) -> None:
    path = script(tmp_path, FAKE_SERVER)
    assert await configured(path) == EngineInfo(
        "llama.cpp", path, "b1234", None, origin="configured"
    )


async def test_configured_engine_that_does_not_run(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"named to this node but does not run.*exit 127"):
        await configured(script(tmp_path, BROKEN_SERVER))
    with pytest.raises(EngineError, match="does not exist"):
        await configured(str(tmp_path / "missing"), "vllm")


def test_engine_option() -> None:
    assert parse_engine_option("llama.cpp=/opt/l/llama-server") == (
        "llama.cpp",
        "/opt/l/llama-server",
    )
    with pytest.raises(EngineError, match="NAME=PATH"):
        parse_engine_option("/opt/l/llama-server")
    with pytest.raises(EngineError, match="knows freetoken, llama.cpp, sglang, tensorrt-llm, vllm"):
        parse_engine_option("tgi=/x")


async def test_node_engines_probe_and_ensure(tmp_path: Path, mirror: Mirror) -> None:
    mirror.publish("b1234", "llama-b1234-bin-ubuntu-x64.tar.gz", release_tar())
    inst = LlamaCppInstaller(
        tmp_path / "engines", mirror.source, "b1234", detect=lambda: "cpu", arch="x86_64"
    )
    vllm = script(tmp_path, "#!/bin/sh\necho 0.10.1\n", "vllm")
    broken = script(tmp_path, BROKEN_SERVER, "sglang-python")
    node = NodeEngines({"vllm": vllm, "sglang": broken}, inst)
    assert node.probed is False and node.installable == ["llama.cpp"]

    found = await node.probe()
    assert node.probed is True
    # vLLM named and running; SGLang named but broken: not reported, reason kept.
    assert found == [EngineInfo("vllm", vllm, "0.10.1", None, "configured")]
    assert "sglang" in node.problems

    words: list[str] = []
    info = await node.ensure("llama.cpp", words.append)
    assert info.origin == "installed" and words[-1] == "installed llama.cpp b1234 (cpu)"
    assert [e.name for e in await node.probe()] == ["vllm", "llama.cpp"]
    assert (await node.ensure("vllm", words.append)).path == vllm

    with pytest.raises(EngineError, match="does not run"):
        await node.ensure("sglang", words.append)


async def test_node_without_installer_names_the_fix(tmp_path: Path) -> None:
    node = NodeEngines()
    assert await node.probe() == [] and node.probed  # probed: an empty list means "none"
    assert node.installable == []
    with pytest.raises(EngineError, match=r"--engine llama\.cpp=PATH"):
        await node.ensure("llama.cpp", lambda _: None)
    with pytest.raises(EngineError, match="unknown engine"):
        await node.ensure("tgi", lambda _: None)


async def test_install_failure_reaches_the_supervisor(tmp_path: Path, mirror: Mirror) -> None:
    inst = LlamaCppInstaller(tmp_path, mirror.source, "b1234", detect=lambda: "cpu")
    words: list[str] = []
    with pytest.raises(EngineError, match="llama.cpp could not be installed: no sha256"):
        await NodeEngines(llamacpp=inst).ensure("llama.cpp", words.append)
    assert words[-1].startswith("install failed: no sha256 is published")
