"""Unpacking refuses any member or link that would leave the install directory, in tar
and zip alike, and keeps what a release needs (execute bits, links to its own libs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw.agent.engines.archive import ArchiveError, unpack

from .conftest import FAKE_SERVER, Member, server_member, tar_gz, zip_bytes

PACKERS = {"tar": tar_gz, "zip": zip_bytes}


def write(tmp_path: Path, kind: str, members: list[Member]) -> Path:
    path = tmp_path / f"release.{'zip' if kind == 'zip' else 'tar.gz'}"
    path.write_bytes(PACKERS[kind](members))
    return path


@pytest.fixture(params=sorted(PACKERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_good_release_unpacks_with_modes_and_links(tmp_path: Path, kind: str) -> None:
    archive = write(
        tmp_path,
        kind,
        [
            Member("llama-b1234", kind="dir"),
            server_member("llama-b1234/llama-server"),
            Member("llama-b1234/libggml.so.0", b"lib", 0o755),
            Member("llama-b1234/libggml.so", kind="symlink", target="libggml.so.0"),
            Member("llama-b1234/docs/README.md", b"# readme"),
        ],
    )
    dest = tmp_path / "out"
    unpack(archive, dest)
    server = dest / "llama-b1234/llama-server"
    assert server.read_text() == FAKE_SERVER
    assert os.access(server, os.X_OK)
    assert os.readlink(dest / "llama-b1234/libggml.so") == "libggml.so.0"
    assert (dest / "llama-b1234/docs/README.md").read_text() == "# readme"


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (Member("../evil", b"x"), "'..' component"),
        (Member("build/../../evil", b"x"), "'..' component"),
        (Member("/tmp/evil-abs", b"x"), "absolute path"),
        (Member("bin/up", kind="symlink", target="../../evil"), "leaves the install"),
        (Member("bin/abs", kind="symlink", target="/etc/passwd"), "absolute path"),
    ],
)
def test_escaping_members_are_refused(
    tmp_path: Path, kind: str, member: Member, words: str
) -> None:
    archive = write(tmp_path, kind, [server_member(), member])
    dest = tmp_path / "deep" / "out"
    with pytest.raises(ArchiveError, match=words):
        unpack(archive, dest)
    # Refused before anything was written: not even the harmless member.
    assert not (dest / "build").exists()
    assert not (tmp_path / "evil").exists() and not (tmp_path / "deep" / "evil").exists()


def test_tar_hard_link_out_and_special_files_are_refused(tmp_path: Path) -> None:
    for member, words in [
        (Member("bin/h", kind="hardlink", target="../outside"), "hard link"),
        (Member("bin/h", kind="hardlink", target="/etc/passwd"), "absolute path"),
        (Member("bin/fifo", kind="fifo"), "FIFO"),
    ]:
        archive = write(tmp_path, "tar", [server_member(), member])
        with pytest.raises(ArchiveError, match=words):
            unpack(archive, tmp_path / "out")


def test_links_that_chain_outside_are_refused(tmp_path: Path, kind: str) -> None:
    # Each link alone reads as inside ("x/.." is "."), but x is the directory itself,
    # so y is its parent. Only resolving through links already written catches it.
    archive = write(
        tmp_path,
        kind,
        [
            Member("x", kind="symlink", target="."),
            Member("y", kind="symlink", target="x/.."),
            Member("y/evil", b"x"),
        ],
    )
    (tmp_path / "out").mkdir()
    with pytest.raises(ArchiveError):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


@pytest.mark.filterwarnings("ignore:Duplicate name")
def test_zip_duplicate_member_is_refused(tmp_path: Path) -> None:
    archive = write(tmp_path, "zip", [server_member(), server_member()])
    with pytest.raises(ArchiveError, match="appears twice"):
        unpack(archive, tmp_path / "out")


def test_size_limit_and_non_archives(tmp_path: Path, kind: str) -> None:
    archive = write(tmp_path, kind, [Member("big", b"x" * 1000)])
    with pytest.raises(ArchiveError, match="unpacks to"):
        unpack(archive, tmp_path / "out", max_bytes=999)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"<html>404</html>")
    with pytest.raises(ArchiveError, match="neither a zip nor a tar"):
        unpack(junk, tmp_path / "out2")


def test_a_dot_top_directory_is_the_install_directory(tmp_path: Path, kind: str) -> None:
    # `tar -C build/bin -czf x.tar.gz .` starts with "./"; that is not an escape.
    archive = write(tmp_path, kind, [Member(".", kind="dir"), server_member("./llama-server")])
    unpack(archive, tmp_path / "out")
    assert os.access(tmp_path / "out" / "llama-server", os.X_OK)
    file_as_top = write(tmp_path, kind, [Member(".", b"x")])
    with pytest.raises(ArchiveError, match="install directory itself"):
        unpack(file_as_top, tmp_path / "out2")
