"""llmgw/release.py: versions in order, the checksums file and its signature refused in
every malformed shape, ``fetch`` against a loopback release source that answers well,
answers garbage, stalls or has no such release, and ``swap_in`` keeping the old zipapp,
with a full disk leaving it byte for byte."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw import release
from llmgw.release import ReleaseError, Version
from tests.support import releases
from tests.support.releases import ReleaseServer, publish

TAG = "py311-linux-x86_64"


def tiny_zipapp(path: Path, filler: int = 0) -> Path:
    """A zipapp of a few hundred bytes (``filler``: that many random bytes stored, so
    its size is what the test needs)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__main__.py", f"print('llmgw {path.name}')\n")
        if filler:
            zf.writestr("filler.bin", os.urandom(filler))
    return path


@pytest.fixture(scope="module")
def key() -> tuple[bytes, str]:
    return releases.signing_key()


@pytest.fixture
def source(tmp_path: Path, key: tuple[bytes, str]) -> Iterator[ReleaseServer]:
    pyz = tiny_zipapp(tmp_path / "build.pyz")
    publish(tmp_path / "releases", "1.2.0", {TAG: pyz}, key[0])
    with ReleaseServer(tmp_path / "releases").running() as server:
        yield server


# --- versions ---------------------------------------------------------------------------


def test_versions_order_with_pre_releases_before_their_release() -> None:
    ordered = ["0.2.0dev1", "0.2.0a1", "0.2.0a2", "0.2.0b1", "0.2.0rc1", "0.2.0", "0.2.1"]
    ordered += ["0.10.0", "1.0.0"]
    parsed = [Version.parse(v) for v in ordered]
    assert sorted(reversed(parsed)) == parsed
    assert [str(v) for v in parsed] == ordered
    assert Version.parse("v0.2.0") == Version.parse("0.2.0")
    assert Version.parse("0.2.0-rc1") == Version.parse("0.2.0rc1")
    assert Version.parse("0.10.0") > Version.parse("0.9.9")


@pytest.mark.parametrize(
    "text", ["", "1.2", "1.2.3.4", "latest", "1.2.3-beta", "1.2.x", "1.2.3 ; rm -rf /"]
)
def test_a_version_of_another_shape_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ReleaseError, match=r"is not an llmgw version: give MAJOR\.MINOR\.PATCH"):
        Version.parse(text)


def test_platform_tags_name_python_and_machine() -> None:
    assert release.platform_tag((3, 12), "aarch64") == "py312-linux-aarch64"
    assert release.asset_name("0.2.0", "py311-linux-x86_64") == "llmgw-0.2.0-py311-linux-x86_64.pyz"
    assert (
        release.release_url("http://h:1/r/", "0.2.0", "SHA256SUMS")
        == "http://h:1/r/download/v0.2.0/SHA256SUMS"
    )


# --- SHA256SUMS and its signature -------------------------------------------------------


def test_sums_round_trip_in_sha256sums_format() -> None:
    digests = {"b.pyz": "ab" * 32, "a.pyz": "cd" * 32}
    data = release.format_sums(digests)
    assert data == f"{'cd' * 32}  a.pyz\n{'ab' * 32}  b.pyz\n".encode()
    assert release.parse_sums(data) == digests
    # sha256sum's binary mark and blank lines are read too.
    assert release.parse_sums(f"\n{'ab' * 32} *b.pyz\n".encode()) == {"b.pyz": "ab" * 32}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("é".encode(), "not ASCII text"),
        (b"", "names no file"),
        (b"\n\n", "names no file"),
        (b"<html>hello</html>\n", "line 1 is not `SHA256  NAME`"),
        (f"{'ab' * 31}  short.pyz\n".encode(), "line 1 is not"),
        (f"{'AB' * 32}  upper.pyz\n".encode(), "line 1 is not"),
        (f"{'ab' * 32}  a.pyz\n{'ab' * 32}  ../up.pyz\n".encode(), "line 2 is not"),
        (f"{'ab' * 32}  sub/dir.pyz\n".encode(), "line 1 is not"),
    ],
)
def test_a_malformed_sums_file_is_refused_by_line(data: bytes, words: str) -> None:
    with pytest.raises(ReleaseError, match=words):
        release.parse_sums(data)


def test_a_signature_is_taken_only_from_a_trusted_key_over_those_bytes(
    key: tuple[bytes, str],
) -> None:
    pem, public = key
    sums = release.format_sums({"a.pyz": "ab" * 32})
    signature = release.sign(sums, pem)
    release.verify_signature(sums, signature, (public,))
    release.verify_signature(sums, signature, (release.PUBLIC_KEYS[0], public))

    refusals = {
        "foreign key": (sums, release.sign(sums, releases.signing_key()[0])),
        "other bytes": (sums + b"\n", signature),
        "garbage": (sums, b"<html>not found</html>"),
        "truncated": (sums, base64.b64encode(base64.b64decode(signature)[:40])),
        "empty": (sums, b""),
    }
    for case, (data, sig) in refusals.items():
        with pytest.raises(ReleaseError) as caught:
            release.verify_signature(data, sig, (public,))
        message = str(caught.value)
        if case in ("foreign key", "other bytes"):
            assert "not signed by a key this llmgw trusts" in message, case
        elif case == "garbage":
            assert "is not a base64 signature" in message
        else:
            assert "is not an Ed25519 signature" in message, case
    # The built-in key alone does not take the test's signature.
    with pytest.raises(ReleaseError, match="not signed by a key this llmgw trusts"):
        release.verify_signature(sums, signature)


def test_a_signing_key_of_another_kind_is_refused() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(ReleaseError, match="not an Ed25519 key"):
        release.sign(b"x", pem)
    with pytest.raises(ReleaseError, match="not an Ed25519 key"):
        release.public_key_of(pem)


# --- fetch --------------------------------------------------------------------------------


def test_fetch_takes_a_signed_release_and_leaves_it_hidden_beside_its_place(
    source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    into = tmp_path / "bin"
    got = release.fetch(source.url, "v1.2.0", into, tag=TAG, keys=(key[1],))
    assert got.version == "1.2.0" and got.name == f"llmgw-1.2.0-{TAG}.pyz"
    assert got.path == into / f".{got.name}.part"
    assert got.path.read_bytes() == (tmp_path / "build.pyz").read_bytes()
    assert got.sha256 == release.sha256_file(got.path) and got.size == got.path.stat().st_size
    # The signature first, then the sums, then the asset.
    assert source.requests == [
        "/download/v1.2.0/SHA256SUMS.sig",
        "/download/v1.2.0/SHA256SUMS",
        f"/download/v1.2.0/{got.name}",
    ]


def test_the_control_planes_sha256_must_be_the_signed_one(
    source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    with pytest.raises(ReleaseError, match="the control plane expects sha256 0000"):
        release.fetch(
            source.url, "1.2.0", tmp_path / "bin", tag=TAG, keys=(key[1],), expect_sha256="0" * 64
        )
    assert not (tmp_path / "bin").exists() or not list((tmp_path / "bin").iterdir())


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("garbage", "is not a base64 signature"),
        ("404", "no llmgw release 1.2.0 at http"),
        ("stall", "the release source stalled"),
    ],
)
def test_a_source_that_misbehaves_is_refused_with_nothing_written(
    mode: str, words: str, source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    source.mode = mode
    into = tmp_path / "bin"
    with pytest.raises(ReleaseError, match=words):
        release.fetch(source.url, "1.2.0", into, tag=TAG, keys=(key[1],), timeout=0.5)
    assert not into.exists() or not list(into.iterdir())


def test_no_such_version_no_such_platform_and_no_source_say_which(
    source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    with pytest.raises(ReleaseError, match="no llmgw release 9.9.9 at .*check the version"):
        release.fetch(source.url, "9.9.9", tmp_path, tag=TAG, keys=(key[1],))
    with pytest.raises(ReleaseError, match="has no llmgw-1.2.0-py39-linux-s390x.pyz .*no build"):
        release.fetch(source.url, "1.2.0", tmp_path, tag="py39-linux-s390x", keys=(key[1],))
    with pytest.raises(ReleaseError, match="cannot reach the release source"):
        release.fetch("http://127.0.0.1:9", "1.2.0", tmp_path, tag=TAG, keys=(key[1],))
    assert list(tmp_path.glob(".*.part")) == []


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        ("signature", "not signed by a key this llmgw trusts"),
        ("checksum", "is not the signed"),
    ],
)
def test_a_tampered_release_is_refused_and_no_part_file_stays(
    tamper: str, words: str, key: tuple[bytes, str], tmp_path: Path
) -> None:
    publish(tmp_path / "r", "2.0.0", {TAG: tiny_zipapp(tmp_path / "b.pyz")}, key[0], tamper=tamper)
    into = tmp_path / "bin"
    with ReleaseServer(tmp_path / "r").running() as server:
        with pytest.raises(ReleaseError, match=words):
            release.fetch(server.url, "2.0.0", into, tag=TAG, keys=(key[1],))
        if tamper == "signature":
            # Refused on the signature: the asset was never asked for.
            assert not any(r.endswith(".pyz") for r in server.requests)
    assert not into.exists() or list(into.iterdir()) == []


def test_a_signed_file_that_is_no_zipapp_is_refused(key: tuple[bytes, str], tmp_path: Path) -> None:
    (tmp_path / "notzip.pyz").write_bytes(b"#!/bin/sh\necho hi\n")
    publish(tmp_path / "r", "2.0.0", {TAG: tmp_path / "notzip.pyz"}, key[0])
    with ReleaseServer(tmp_path / "r").running() as server:
        with pytest.raises(ReleaseError, match="not a zipapp"):
            release.fetch(server.url, "2.0.0", tmp_path / "bin", tag=TAG, keys=(key[1],))
    assert list((tmp_path / "bin").iterdir()) == []


# --- swap_in --------------------------------------------------------------------------------


def test_swap_in_keeps_the_old_zipapp_beside_the_new(
    source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    bin_dir = tmp_path / "opt"
    bin_dir.mkdir()
    target = tiny_zipapp(bin_dir / "llmgw.pyz")
    old = target.read_bytes()
    got = release.fetch(source.url, "1.2.0", bin_dir, tag=TAG, keys=(key[1],))
    kept = release.swap_in(got, target, "1.1.0")
    assert kept == bin_dir / "llmgw-1.1.0.pyz"
    assert kept.read_bytes() == old
    assert target.read_bytes() == (tmp_path / "build.pyz").read_bytes()
    assert target.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in bin_dir.iterdir()) == ["llmgw-1.1.0.pyz", "llmgw.pyz"]
    assert release.running_zipapp(str(target)) == target.resolve()
    assert release.running_zipapp(str(tmp_path / "build.pyz" / "nope")) is None


def test_swap_in_refuses_a_file_not_beside_its_target(
    source: ReleaseServer, key: tuple[bytes, str], tmp_path: Path
) -> None:
    (tmp_path / "opt").mkdir()
    target = tiny_zipapp(tmp_path / "opt" / "llmgw.pyz")
    old = target.read_bytes()
    got = release.fetch(source.url, "1.2.0", tmp_path / "elsewhere", tag=TAG, keys=(key[1],))
    with pytest.raises(ReleaseError, match="not beside"):
        release.swap_in(got, target, "1.1.0")
    assert target.read_bytes() == old
    assert not got.path.exists()
    assert sorted(p.name for p in (tmp_path / "opt").iterdir()) == ["llmgw.pyz"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a disk that fills."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk is a 64k tmpfs, and mounting one needs root")
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"this machine cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_leaves_the_old_zipapp_byte_for_byte_and_no_part_file(
    small_disk: Path, key: tuple[bytes, str], tmp_path: Path
) -> None:
    target = tiny_zipapp(small_disk / "llmgw.pyz", filler=20_000)
    old = target.read_bytes()
    big = tiny_zipapp(tmp_path / "big.pyz", filler=80_000)  # more than the disk has left
    publish(tmp_path / "r", "3.0.0", {TAG: big}, key[0])
    with ReleaseServer(tmp_path / "r").running() as server:
        with pytest.raises(ReleaseError, match=r"writing .* failed .*No space left"):
            release.fetch(server.url, "3.0.0", small_disk, tag=TAG, keys=(key[1],))
    assert target.read_bytes() == old
    assert sorted(p.name for p in small_disk.iterdir()) == ["llmgw.pyz"]
    # And the old one still runs.
    ran = subprocess.run(["python3", str(target)], capture_output=True, text=True, timeout=30)
    assert ran.stdout == "llmgw llmgw.pyz\n"


def test_a_full_disk_during_the_swap_leaves_the_old_zipapp(
    small_disk: Path, key: tuple[bytes, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the old zipapp cannot be linked (another filesystem's rules), it is copied:
    a disk with no room for that copy stops the swap with the old file in place."""
    target = tiny_zipapp(small_disk / "llmgw.pyz", filler=24_000)
    old = target.read_bytes()
    publish(tmp_path / "r", "3.0.0", {TAG: tiny_zipapp(tmp_path / "n.pyz", 24_000)}, key[0])
    with ReleaseServer(tmp_path / "r").running() as server:
        got = release.fetch(server.url, "3.0.0", small_disk, tag=TAG, keys=(key[1],))

    def no_link(src: object, dst: object) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(ReleaseError, match=r"swapping .* failed .*the old zipapp stays"):
        release.swap_in(got, target, "2.0.0")
    assert target.read_bytes() == old
    assert sorted(p.name for p in small_disk.iterdir()) == ["llmgw.pyz"]
