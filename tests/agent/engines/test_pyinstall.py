"""vLLM and SGLang installed with uv from a loopback package index serving stand-in
wheels the tests build: the whole path (environment, uv pip install, version command,
marker), the installs listed again, and each refusal. Nothing reaches past 127.0.0.1:
uv is given the index with --index-url (which replaces PyPI) and a dead proxy for
anything else."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.engines import adapter, pyinstall
from llmgw.agent.engines.install import InstallError
from llmgw.agent.engines.pyinstall import PythonEngineInstaller, find_uv
from llmgw.wire.messages import EngineInfo, ShardSpec
from tests.support.pyindex import PackageIndex, standin_wheel


@pytest.fixture(scope="module")
def index() -> Iterator[PackageIndex]:
    with PackageIndex() as idx:
        idx.add(*standin_wheel("vllm", "0.0.1"))
        idx.add(*standin_wheel("vllm", "0.0.2"))
        idx.add(*standin_wheel("vllm", "0.0.3", reports="0.0.9"))
        idx.add(*standin_wheel("sglang", "0.0.1"))
        yield idx


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """uv reaches nothing but 127.0.0.1, and reads no uv settings of whoever runs this."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_DEFAULT_INDEX"):
        monkeypatch.delenv(name, raising=False)


def installer(
    tmp_path: Path, index: PackageIndex, words: list[str], engine: str = "vllm", **kw: Any
) -> PythonEngineInstaller:
    kw.setdefault("has_card", lambda: False)
    return PythonEngineInstaller(
        tmp_path / "engines", engine, index_url=index.url, progress=words.append, **kw
    )


def marker(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / "installed.json").read_text()))


def entries(tmp_path: Path, engine: str = "vllm") -> list[str]:
    root = tmp_path / "engines" / engine
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def spec(engine: str) -> ShardSpec:
    return ShardSpec("r1", engine, "hf:org/model", 8001, "k", "fp", model="m")


def test_find_uv_beside_this_python() -> None:
    assert find_uv() == str(Path(sys.executable).parent / "uv")


async def test_install_vllm(tmp_path: Path, index: PackageIndex) -> None:
    words: list[str] = []
    info = await installer(tmp_path, index, words).ensure("0.0.1", "cpu")
    directory = tmp_path / "engines" / "vllm" / "0.0.1-cpu"
    entry = directory / "venv" / "bin" / "vllm"
    assert info == EngineInfo("vllm", str(entry), "0.0.1", "cpu", "installed")
    assert all(w.startswith("installing: vllm 0.0.1: ") for w in words[:-1])
    assert "installing: vllm 0.0.1: uv pip install vllm==0.0.1 (cpu)" in words
    assert words[-1] == "installed vllm 0.0.1 (cpu)"
    m = marker(directory)
    assert m["engine"] == "vllm" and m["version"] == "0.0.1" and m["build"] == "cpu"
    assert (m["path"], m["package"], m["index_url"]) == (str(entry), "vllm", index.url)
    assert (m["torch_backend"], m["reported_version"]) == ("cpu", "0.0.1")
    assert isinstance(m["installed_at"], float)
    assert entries(tmp_path) == ["0.0.1-cpu"]  # nothing half-made left beside it
    # The path is what the adapter's command line takes as its binary: it runs.
    argv = adapter("vllm").command(info.path, spec("vllm"), "/models/m", "127.0.0.1")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.startswith("vllm serve /models/m --host 127.0.0.1 --port 8001")


async def test_installed_lists_it_and_ensure_again_installs_nothing(
    tmp_path: Path, index: PackageIndex
) -> None:
    first = await installer(tmp_path, index, []).ensure("0.0.1", "cpu")
    directory = tmp_path / "engines" / "vllm" / "0.0.1-cpu"
    stamp = (directory / "installed.json").stat().st_mtime_ns
    asked = len(index.requests)
    words: list[str] = []
    again = installer(tmp_path, index, words)  # a restarted agent: a new installer
    assert await again.installed() == [first]
    assert await again.ensure("0.0.1", "cpu") == first
    assert words == []
    assert len(index.requests) == asked
    assert (directory / "installed.json").stat().st_mtime_ns == stamp


async def test_two_versions_side_by_side_and_remove(tmp_path: Path, index: PackageIndex) -> None:
    inst = installer(tmp_path, index, [])
    one = await inst.ensure("0.0.1", "cpu")
    two = await inst.ensure("0.0.2", "cpu")
    assert await inst.installed() == [two, one]
    assert inst.remove("0.0.1", "cpu") is True
    assert await inst.installed() == [two]
    assert entries(tmp_path) == ["0.0.2-cpu"]
    assert inst.remove("0.0.1", "cpu") is False


async def test_one_install_for_many_asking_at_once(tmp_path: Path, index: PackageIndex) -> None:
    words: list[str] = []
    inst = installer(tmp_path, index, words)
    found = await asyncio.gather(*(inst.ensure("0.0.1", "cpu") for _ in range(3)))
    assert found[0] == found[1] == found[2]
    assert words.count("installed vllm 0.0.1 (cpu)") == 1


async def test_version_not_in_the_index(tmp_path: Path, index: PackageIndex) -> None:
    words: list[str] = []
    with pytest.raises(InstallError, match=r"vllm==9\.9") as err:
        await installer(tmp_path, index, words).ensure("9.9", "cpu")
    assert "no version of vllm==9.9" in str(err.value)
    assert words[-1] == f"install failed: {err.value}"
    assert entries(tmp_path) == []


async def test_wheel_saying_another_version_is_refused(tmp_path: Path, index: PackageIndex) -> None:
    inst = installer(tmp_path, index, [])
    with pytest.raises(InstallError, match=r"vllm 0\.0\.3 was asked for.*says it is 0\.0\.9"):
        await inst.ensure("0.0.3", "cpu")
    assert entries(tmp_path) == []
    assert await inst.installed() == []


@pytest.mark.parametrize(
    ("version", "build", "named"),
    [("../0.0.1", "cpu", "'../0.0.1'"), ("", "cpu", "''"), ("0.0.1", "rocm", "'rocm'")],
)
async def test_bad_version_or_build_refused_before_anything_runs(
    tmp_path: Path, index: PackageIndex, version: str, build: str, named: str
) -> None:
    asked = len(index.requests)
    words: list[str] = []
    inst = installer(tmp_path, index, words)
    with pytest.raises(InstallError, match=named) as err:
        await inst.ensure(version, build)
    assert words == [f"install failed: {err.value}"]
    with pytest.raises(InstallError, match=named):
        inst.remove(version, build)
    assert not (tmp_path / "engines").exists()
    assert len(index.requests) == asked


async def test_install_sglang(tmp_path: Path, index: PackageIndex) -> None:
    words: list[str] = []
    info = await installer(tmp_path, index, words, "sglang").ensure("0.0.1", "cu129")
    entry = tmp_path / "engines" / "sglang" / "0.0.1-cu129" / "venv" / "bin" / "python"
    assert info == EngineInfo("sglang", str(entry), "0.0.1", "cu129", "installed")
    assert marker(entry.parents[2])["torch_backend"] == "cu129"
    assert words[-1] == "installed sglang 0.0.1 (cu129)"
    argv = adapter("sglang").command(info.path, spec("sglang"), "/models/m", "127.0.0.1")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.startswith("sglang.launch_server --model-path /models/m --host 127.0.0.1")


async def test_no_uv(tmp_path: Path, index: PackageIndex) -> None:
    words: list[str] = []
    with pytest.raises(InstallError, match="install uv on this node: pip install uv"):
        await installer(tmp_path, index, words, uv="/nonexistent").ensure("0.0.1", "cpu")
    assert words[-1].startswith("install failed: installing vllm needs uv")


async def test_uv_too_old_for_torch_backend(tmp_path: Path, index: PackageIndex) -> None:
    old = tmp_path / "uv"
    old.write_text("#!/bin/sh\necho 'uv 0.5.31'\n")
    old.chmod(0o755)
    with pytest.raises(InstallError, match=r"uv 0\.5\.31, which has no --torch-backend"):
        await installer(tmp_path, index, [], uv=str(old)).ensure("0.0.1", "cpu")


async def test_card_this_build_cannot_use_is_refused(tmp_path: Path, index: PackageIndex) -> None:
    inst = installer(tmp_path, index, [], has_card=lambda: True)
    with pytest.raises(InstallError, match=r"llmgw ctl engine-build NODE cu129` \(or cpu\)"):
        await inst.ensure("0.0.1", "auto")
    assert entries(tmp_path) == []


async def test_install_that_no_longer_runs_is_left_out_then_replaced(
    tmp_path: Path, index: PackageIndex
) -> None:
    words: list[str] = []
    inst = installer(tmp_path, index, words)
    info = await inst.ensure("0.0.1", "cpu")
    Path(info.path).unlink()
    (tmp_path / "engines" / "vllm" / "0.0.2-cpu").mkdir()  # no marker: never read
    assert await inst.installed() == []
    assert "no longer runs" in inst.problems["0.0.1-cpu"]
    assert list(inst.problems) == ["0.0.1-cpu"]
    assert await inst.ensure("0.0.1", "cpu") == info
    assert inst.problems == {}
    assert await inst.installed() == [info]


async def test_install_time_limit(tmp_path: Path, index: PackageIndex) -> None:
    words: list[str] = []
    with pytest.raises(InstallError, match=r"did not finish in 0s"):
        await installer(tmp_path, index, words, timeout=0.001).ensure("0.0.1", "cpu")
    assert entries(tmp_path) == []


async def test_uv_lines_said_at_most_one_a_while(
    tmp_path: Path, index: PackageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pyinstall, "REPORT_EVERY", 0.3)
    fake = tmp_path / "uv"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "uv 0.9.0"; exit 0; }\n'
        "echo 'Using CPython 3.11 interpreter at: /usr/bin/python3'\n"
        "echo one; echo two; echo three; sleep 1; echo four; echo; exit 2\n"
    )
    fake.chmod(0o755)
    words: list[str] = []
    with pytest.raises(InstallError) as err:
        await installer(tmp_path, index, words, uv=str(fake)).ensure("0.0.1", "cpu")
    said = "installing: vllm 0.0.1: "
    assert words == [
        f"{said}making its environment",
        f"{said}one",
        f"{said}three",  # held back until its turn, "two" passed over
        f"{said}four",
        f"install failed: {err.value}",
    ]
    assert str(err.value) == "uv could not make the environment (exit 2): two | three | four"
    assert entries(tmp_path) == []
