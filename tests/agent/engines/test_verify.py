"""ldd read and a missing library named outright; an engine seen to run or not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmgw.agent.engines import adapter
from llmgw.agent.engines.verify import (
    EngineCheckError,
    check_libraries,
    missing_library,
    parse_ldd,
    run_ldd,
    run_output,
    seen_to_run,
)

from .conftest import BROKEN_SERVER, FAKE_SERVER

LDD_CUDA_MISSING = """\
\tlinux-vdso.so.1 (0x00007ffc8a5f2000)
\tlibllama.so => /opt/llama/build/bin/libllama.so (0x00007f0e1c000000)
\tlibggml-cuda.so => /opt/llama/build/bin/libggml-cuda.so (0x00007f0e10000000)
\tlibcudart.so.12 => not found
\tlibcublas.so.12 => not found
\tlibgomp.so.1 => /lib/x86_64-linux-gnu/libgomp.so.1 (0x00007f0e0ff00000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e0fc00000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0e1c400000)
"""


def script(tmp_path: Path, text: str, name: str = "llama-server") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on this machine")
async def test_real_ldd_output_parses() -> None:
    binary = Path(shutil.which("ls") or "/bin/ls")
    output = await run_ldd(binary)
    assert output is not None and "libc.so" in output  # the real format, read for real
    assert parse_ldd(output) == []
    await check_libraries(binary)


@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on this machine")
async def test_real_ldd_on_a_script_needs_nothing(tmp_path: Path) -> None:
    output = await run_ldd(script(tmp_path, FAKE_SERVER))
    assert output is not None and "not a dynamic executable" in output
    assert parse_ldd(output) == []


def test_parse_ldd_names_the_missing() -> None:
    assert parse_ldd(LDD_CUDA_MISSING) == ["libcudart.so.12", "libcublas.so.12"]


async def test_missing_library_is_named_with_its_fix(tmp_path: Path) -> None:
    async def ldd(_: Path) -> str:
        return LDD_CUDA_MISSING

    with pytest.raises(EngineCheckError) as err:
        await check_libraries(tmp_path / "llama-server", ldd)
    assert str(err.value).startswith("libcudart.so.12 => not found: install the CUDA 12 runtime")
    assert "libcublas.so.12 => not found" in str(err.value)


def test_missing_library_words(tmp_path: Path) -> None:
    assert "libgomp1" in missing_library("libgomp.so.1")
    assert "NVIDIA driver" in missing_library("libcuda.so.1")
    assert "CUDA 13 runtime" in missing_library("libcublasLt.so.13")
    assert "apt-file search libfoo.so.2" in missing_library("libfoo.so.2")
    (tmp_path / "libllama.so").write_bytes(b"")
    assert "ships it beside" in missing_library("libllama.so", tmp_path / "llama-server")


async def test_no_ldd_is_no_verdict(tmp_path: Path) -> None:
    async def absent(_: Path) -> None:
        return None

    await check_libraries(tmp_path / "x", absent)


async def test_seen_to_run(tmp_path: Path) -> None:
    version, output = await seen_to_run(adapter("llama.cpp"), str(script(tmp_path, FAKE_SERVER)))
    assert version == "b1234" and "built with" in output


async def test_not_seen_to_run(tmp_path: Path) -> None:
    llama = adapter("llama.cpp")
    with pytest.raises(EngineCheckError, match=r"failed \(exit 127\).*libllama\.so"):
        await seen_to_run(llama, str(script(tmp_path, BROKEN_SERVER)))
    with pytest.raises(EngineCheckError, match="does not exist"):
        await seen_to_run(llama, str(tmp_path / "nothing"))
    plain = tmp_path / "plain"
    plain.write_text(FAKE_SERVER)
    with pytest.raises(EngineCheckError, match="not executable"):
        await seen_to_run(llama, str(plain))


async def test_a_hanging_command_is_stopped() -> None:
    with pytest.raises(EngineCheckError, match="did not finish"):
        await run_output(["sleep", "5"], timeout=0.2)
