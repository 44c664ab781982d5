"""llama.cpp installed from a loopback mirror serving real archives the tests build:
the whole path (download, sha256, unpack, ldd, --version, marker) and each refusal."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from llmgw.agent.engines.install import (
    InstallError,
    LlamaCppInstaller,
    detect_build,
    human_size,
    parse_sha256_file,
    release_tag,
)
from llmgw.wire.messages import EngineInfo

from .conftest import BROKEN_SERVER, Member, Mirror, marker, release_tar, server_member, zip_bytes

CPU_ASSET = "llama-b1234-bin-ubuntu-x64.tar.gz"


def installer(
    tmp_path: Path, mirror: Mirror, words: list[str], version: str | None = "b1234", **kw: object
) -> LlamaCppInstaller:
    kw.setdefault("detect", lambda: "cpu")
    kw.setdefault("arch", "x86_64")
    return LlamaCppInstaller(
        tmp_path / "engines",
        mirror.source,
        version,
        words.append,
        **kw,  # type: ignore[arg-type]
    )


async def test_install_from_the_mirror(tmp_path: Path, mirror: Mirror) -> None:
    digest = mirror.publish("b1234", CPU_ASSET, release_tar())
    words: list[str] = []
    inst = installer(tmp_path, mirror, words)
    info = await inst.ensure()
    directory = tmp_path / "engines" / "llama.cpp" / "b1234-cpu"
    binary = directory / "build" / "bin" / "llama-server"
    assert info == EngineInfo("llama.cpp", str(binary), "b1234", "cpu", "installed")
    assert re.fullmatch(rf"installing: downloading {CPU_ASSET} \(\d+ (B|KB)\)", words[0])
    assert words[1:] == [
        "installing: checking sha256",
        "installing: unpacking",
        "installing: checking libraries",
        "installing: running llama-server --version",
        "installed llama.cpp b1234 (cpu)",
    ]
    m = marker(directory)
    assert (m["version"], m["build"], m["path"], m["sha256"]) == (
        "b1234",
        "cpu",
        str(binary),
        digest,
    )
    assert m["reported_version"] == "b1234"
    # Nothing left beside it: no partial download, no staging tree.
    assert sorted(p.name for p in directory.parent.iterdir()) == ["b1234-cpu"]
    # Installed, re-checked, and not fetched again.
    assert await inst.installed() == [info]
    assert await inst.ensure() == info
    assert mirror.count(CPU_ASSET) == 1


async def test_github_checksum_from_the_api(tmp_path: Path, mirror: Mirror) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar(), sha=False)
    inst = installer(tmp_path, mirror, [], checksum="github", github_api=f"{mirror.base}/api")
    assert (await inst.ensure()).version == "b1234"
    assert mirror.count("/api/repos/ggml-org/llama.cpp/releases/tags/b1234") == 1
    assert mirror.count(".sha256") == 0


def test_checksum_source_defaults_by_host(tmp_path: Path) -> None:
    assert LlamaCppInstaller(tmp_path).checksum == "github"
    assert LlamaCppInstaller(tmp_path, "http://mirror.internal/llama/releases").checksum == "file"


async def test_latest_follows_the_redirect(tmp_path: Path, mirror: Mirror) -> None:
    mirror.latest = "b2000"
    mirror.publish("b2000", "llama-b2000-bin-ubuntu-x64.tar.gz", release_tar())
    words: list[str] = []
    info = await installer(tmp_path, mirror, words, version=None).ensure()
    assert info.version == "b2000" and words[-1] == "installed llama.cpp b2000 (cpu)"


async def test_no_length_means_no_size_invented(tmp_path: Path, mirror: Mirror) -> None:
    mirror.chunked = True
    mirror.publish("b1234", CPU_ASSET, release_tar())
    words: list[str] = []
    await installer(tmp_path, mirror, words).ensure()
    assert words[0] == f"installing: downloading {CPU_ASSET}"
    assert not any("%" in w or " of " in w for w in words)


async def test_zip_release_and_other_layout(tmp_path: Path, mirror: Mirror) -> None:
    asset = "llama-b1234-bin-ubuntu-x64.zip"
    mirror.publish("b1234", asset, zip_bytes([server_member("llama-b1234/llama-server")]))
    inst = installer(tmp_path, mirror, [], assets={"cpu": "llama-{tag}-bin-ubuntu-{arch}.zip"})
    info = await inst.ensure()
    assert info.path.endswith("b1234-cpu/llama-b1234/llama-server")


async def test_cuda_build_names_its_archive_and_missing_runtime(
    tmp_path: Path, mirror: Mirror
) -> None:
    asset = "llama-b1234-bin-ubuntu-cuda-12.4-x64.tar.gz"
    mirror.publish("b1234", asset, release_tar())

    async def ldd(_: Path) -> str:
        return "\tlibcudart.so.12 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"

    words: list[str] = []
    inst = installer(tmp_path, mirror, words, detect=lambda: "cuda", ldd=ldd)
    with pytest.raises(InstallError, match=r"^libcudart\.so\.12 => not found: install the CUDA 12"):
        await inst.ensure()
    assert words[0].startswith(f"installing: downloading {asset}")
    assert words[-1].startswith("install failed: libcudart.so.12 => not found")
    assert not (tmp_path / "engines/llama.cpp/b1234-cuda/installed.json").exists()
    assert await inst.installed() == []


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (Member("../evil", b"x"), "'..' component"),
        (Member("/tmp/llmgw-test-evil", b"x"), "absolute path"),
        (Member("build/bin/up", kind="symlink", target="../../../../evil"), "leaves the install"),
    ],
)
async def test_bad_archives_are_refused(
    tmp_path: Path, mirror: Mirror, extra: Member, words: str
) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar(extra=[extra]))
    said: list[str] = []
    inst = installer(tmp_path, mirror, said)
    with pytest.raises(InstallError, match=words):
        await inst.ensure()
    assert said[-1].startswith("install failed: ")
    assert not (tmp_path / "evil").exists() and not Path("/tmp/llmgw-test-evil").exists()
    assert not (tmp_path / "engines/llama.cpp/b1234-cpu").exists()
    assert await inst.installed() == []


async def test_checksum_mismatch_is_refused_before_unpacking(
    tmp_path: Path, mirror: Mirror
) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar(), sha_text="0" * 64 + f"  {CPU_ASSET}\n")
    words: list[str] = []
    with pytest.raises(InstallError, match="failed its sha256 check"):
        await installer(tmp_path, mirror, words).ensure()
    assert "installing: unpacking" not in words
    assert sorted(p.name for p in (tmp_path / "engines/llama.cpp").iterdir()) == []


async def test_no_published_checksum_no_install(tmp_path: Path, mirror: Mirror) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar(), sha=False)
    with pytest.raises(InstallError, match="no sha256 is published"):
        await installer(tmp_path, mirror, []).ensure()
    assert mirror.count(CPU_ASSET) == 0  # refused before a byte of the archive


async def test_missing_release_is_reported(tmp_path: Path, mirror: Mirror) -> None:
    with pytest.raises(InstallError, match="HTTP 404"):
        await installer(tmp_path, mirror, [], version="9999").ensure()


async def test_failing_version_run_is_not_installed(tmp_path: Path, mirror: Mirror) -> None:
    tar = release_tar(script=BROKEN_SERVER)
    mirror.publish("b1234", CPU_ASSET, tar)
    inst = installer(tmp_path, mirror, [])
    with pytest.raises(InstallError, match=r"llama-server --version` failed \(exit 127\)"):
        await inst.ensure()
    assert (tmp_path / "engines/llama.cpp/b1234-cpu/build/bin/llama-server").exists()
    assert not (tmp_path / "engines/llama.cpp/b1234-cpu/installed.json").exists()
    assert await inst.installed() == []


async def test_recheck_drops_an_install_that_stopped_running(
    tmp_path: Path, mirror: Mirror
) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar())
    libs = {"out": "\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"}

    async def ldd(_: Path) -> str:
        return libs["out"]

    words: list[str] = []
    inst = installer(tmp_path, mirror, words, ldd=ldd)
    info = await inst.ensure()
    libs["out"] = "\tlibgomp.so.1 => not found\n"  # an unrelated upgrade removed it
    assert await inst.installed() == []
    assert words[-1] == (
        "llama.cpp in b1234-cpu no longer runs: libgomp.so.1 => not found: install the "
        "GNU OpenMP runtime (apt install libgomp1; dnf install libgomp)"
    )
    assert "b1234-cpu" in inst.problems
    libs["out"] = ""
    assert await inst.installed() == [info] and inst.problems == {}


async def test_unmarked_or_tampered_directories_are_not_installed(
    tmp_path: Path, mirror: Mirror
) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar())
    inst = installer(tmp_path, mirror, [])
    info = await inst.ensure()
    stray = tmp_path / "engines/llama.cpp/b999-cpu/build/bin"
    stray.mkdir(parents=True)
    (stray / "llama-server").write_text("#!/bin/sh\n")
    assert await inst.installed() == [info]
    mark = tmp_path / "engines/llama.cpp/b1234-cpu/installed.json"
    mark.write_text(mark.read_text().replace('"build/bin/llama-server"', '"../../../bin/sh"'))
    assert await inst.installed() == []


async def test_concurrent_asks_make_one_install(tmp_path: Path, mirror: Mirror) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar())
    inst = installer(tmp_path, mirror, [])
    infos = await asyncio.gather(*(inst.ensure() for _ in range(4)))
    assert len(set(infos)) == 1 and mirror.count(CPU_ASSET) == 1


async def test_install_replaces_an_unmarked_leftover(tmp_path: Path, mirror: Mirror) -> None:
    mirror.publish("b1234", CPU_ASSET, release_tar())
    leftover = tmp_path / "engines/llama.cpp/b1234-cpu"
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("half an old install")
    info = await installer(tmp_path, mirror, []).ensure()
    assert not (leftover / "junk").exists() and Path(info.path).is_file()


def test_helpers(tmp_path: Path) -> None:
    assert human_size(16_400_000) == "16 MB"
    assert human_size(1_500_000) == "1.5 MB"
    assert human_size(512) == "512 B"
    assert release_tag("1234") == "b1234" and release_tag("b1234") == "b1234"
    with pytest.raises(InstallError):
        release_tag("../b1")
    digest = "a" * 64
    assert parse_sha256_file(f"{digest}\n", "x.tar.gz") == digest
    assert parse_sha256_file(f"{digest} *x.tar.gz\n", "x.tar.gz") == digest
    with pytest.raises(InstallError, match="checksum of"):
        parse_sha256_file(f"{digest}  y.tar.gz\n", "x.tar.gz")
    with pytest.raises(InstallError, match="no sha256"):
        parse_sha256_file("<html>", "x.tar.gz")
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54\n")
    assert detect_build(tmp_path / "version") == "cuda"
    assert detect_build(tmp_path / "absent") == "cpu"
