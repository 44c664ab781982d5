"""What ``node add`` and ``server add`` copy (llmgw/client/zipappsource.py), without ssh:
the release the control plane names, for the machine's own Python and CPU, fetched from a
loopback release source and checked; ``--source`` overriding where; ``--zipapp`` as it is;
and each refusal saying what to do."""

from __future__ import annotations

import argparse
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.client.adminbase import AdminError
from llmgw.client.remote import NodeAddError, NodeFacts
from llmgw.client.zipappsource import explicit_zipapp, zipapp_for
from tests.support import releases
from tests.support.fakeadmin import FakeAdmin
from tests.support.releases import ReleaseServer, publish

VERSION = "4.5.6"


def facts(python: tuple[int, int] = (3, 12), machine: str = "aarch64") -> NodeFacts:
    text = f"{python[0]}.{python[1]}.1"
    return NodeFacts(
        uid=0,
        hostname="gpu-9",
        machine=machine,
        python=python,
        python_text=text,
        systemd=False,
        sudo=False,
    )


def pyz(path: Path, marker: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__main__.py", f"# {marker}\n")
    return path


@pytest.fixture(scope="module")
def key() -> tuple[bytes, str]:
    return releases.signing_key()


@pytest.fixture
def source(tmp_path: Path, key: tuple[bytes, str]) -> Iterator[ReleaseServer]:
    builds = {
        "py312-linux-aarch64": pyz(tmp_path / "arm.pyz", "arm"),
        "py311-linux-x86_64": pyz(tmp_path / "x86.pyz", "x86"),
    }
    publish(tmp_path / "r", VERSION, builds, key[0])
    with ReleaseServer(tmp_path / "r").running() as server:
        yield server


def args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"zipapp": None, "source": None, **given})


def admin_naming(source: str) -> FakeAdmin:
    admin = FakeAdmin()
    admin.answer("GET", "/api/v1/release", {"version": VERSION, "source": source})
    return admin


def test_the_release_for_the_machines_python_and_cpu_is_fetched_and_checked(
    source: ReleaseServer,
    key: tuple[bytes, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    into = tmp_path / "in"
    got = zipapp_for(
        args(),
        admin_naming(source.url),
        facts(),
        "gpu-9",
        systemd=False,
        into=into,
        explicit=None,
        keys=(key[1],),
    )
    assert got == into / f"llmgw-{VERSION}-py312-linux-aarch64.pyz"
    assert got.read_bytes() == (tmp_path / "arm.pyz").read_bytes()
    out = capsys.readouterr().out
    assert f"fetching llmgw {VERSION} for py312-linux-aarch64 from {source.url}" in out
    assert list(into.iterdir()) == [got]


def test_source_overrides_the_control_planes_and_a_foreign_release_is_refused(
    source: ReleaseServer, tmp_path: Path
) -> None:
    # This llmgw trusts only the built-in release key: the test's release is refused.
    admin = admin_naming("http://127.0.0.1:9/never")
    with pytest.raises(NodeAddError) as caught:
        zipapp_for(
            args(source=source.url),
            admin,
            facts(),
            "gpu-9",
            systemd=False,
            into=tmp_path / "in",
            explicit=None,
        )
    message = str(caught.value)
    assert f"llmgw {VERSION} for py312-linux-aarch64 from {source.url} was refused" in message
    assert "not signed by a key this llmgw trusts" in message
    assert "Nothing was copied to gpu-9" in message and "--zipapp PATH" in message
    assert not any(r.endswith(".pyz") for r in source.requests)
    assert not (tmp_path / "in").exists()  # refused before anything was written


def test_a_machine_no_build_is_for_is_refused_by_name(
    source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    with pytest.raises(NodeAddError, match=r"has no llmgw-4\.5\.6-py313-linux-riscv64\.pyz"):
        zipapp_for(
            args(),
            admin_naming(source.url),
            facts((3, 13), "riscv64"),
            "gpu-9",
            systemd=False,
            into=tmp_path / "in",
            explicit=None,
            keys=(key[1],),
        )


def test_an_older_control_plane_that_names_no_release_says_to_pass_zipapp(
    tmp_path: Path,
) -> None:
    admin = FakeAdmin()
    admin.answer("GET", "/api/v1/release", AdminError("no route", "not_found", 404))
    with pytest.raises(NodeAddError, match="names no llmgw release .*pass --zipapp PATH"):
        zipapp_for(args(), admin, facts(), "gpu-9", systemd=False, into=tmp_path, explicit=None)


def test_zipapp_is_copied_as_it_is_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = pyz(tmp_path / "mine.pyz", "mine")
    given = args(zipapp=str(mine))
    explicit = explicit_zipapp(given)
    assert explicit == mine
    admin = FakeAdmin()  # asked nothing
    got = zipapp_for(
        given, admin, facts(), "gpu-9", systemd=False, into=tmp_path / "in", explicit=explicit
    )
    assert got == mine and admin.asked == []
    assert f"--zipapp: copying {mine} as it is, unchecked" in capsys.readouterr().out
    with pytest.raises(NodeAddError, match="no such file"):
        explicit_zipapp(args(zipapp=str(tmp_path / "missing.pyz")))


def bundle_dir(root: Path, key: tuple[bytes, str], tamper: str | None = None) -> Path:
    """A bundle's directory as `bundle create` writes it: its manifest, and llmgw's
    release under llmgw/ in GitHub's layout."""
    root.mkdir()
    (root / "manifest.json").write_text("{}")
    build = pyz(root.parent / f"{root.name}.pyz", "from the bundle")
    publish(root / "llmgw", VERSION, {"py312-linux-aarch64": build}, key[0], tamper=tamper)
    return root


def test_the_release_comes_from_a_bundles_directory_checked_as_from_a_source(
    key: tuple[bytes, str], tmp_path: Path
) -> None:
    bundle = bundle_dir(tmp_path / "bundle", key)
    admin = admin_naming("http://127.0.0.1:9/never")  # not asked for files: the bundle is
    into = tmp_path / "in"
    got = zipapp_for(
        args(bundle=str(bundle)),
        admin,
        facts(),
        "gpu-9",
        systemd=False,
        into=into,
        explicit=None,
        keys=(key[1],),
    )
    assert got.read_bytes() == (tmp_path / "bundle.pyz").read_bytes()
    # A bundle whose zipapp is not the one its signed sums name is refused, nothing kept.
    forged = bundle_dir(tmp_path / "forged", key, tamper="checksum")
    with pytest.raises(NodeAddError, match="sha256 .* is not the signed .*Nothing was copied"):
        zipapp_for(
            args(bundle=str(forged)),
            admin,
            facts(),
            "gpu-9",
            systemd=False,
            into=tmp_path / "in2",
            explicit=None,
            keys=(key[1],),
        )
    assert not any((tmp_path / "in2").glob("*.pyz*"))


def test_a_bundle_that_is_a_tar_or_not_a_bundle_is_refused_saying_what_to_do(
    tmp_path: Path,
) -> None:
    tar = tmp_path / "b.tar"
    tar.write_bytes(b"")
    for given, said in [(tar, "is a tar: unpack it first"), (tmp_path, "not a bundle's dir")]:
        with pytest.raises(NodeAddError, match=said):
            zipapp_for(
                args(bundle=str(given)),
                admin_naming("http://127.0.0.1:9/never"),
                facts(),
                "gpu-9",
                systemd=False,
                into=tmp_path / "in",
                explicit=None,
            )
