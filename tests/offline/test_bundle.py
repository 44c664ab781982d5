"""Bundles made from loopback sources and imported into a mirror: everything checked
before anything lands, and a refusal leaves the mirror as it was."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from llmgw import release
from llmgw.offline.bundle import create
from llmgw.offline.bundleimport import import_bundle, read_index
from llmgw.offline.manifest import MANIFEST, BundleError, dump_manifest, read_manifest
from tests.agent.weights.weights_fakehub import FakeHub
from tests.support.bundles import ENGINE_TAG, GGUF, VERSION, Sources, plan


async def test_a_bundle_holds_each_part_checked_and_fills_the_mirror(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    made = await create(plan(sources, hub.endpoint, tmp_path / "bundle"))
    manifest = read_manifest(made.path / MANIFEST)
    kinds = {f.path: f.kind for f in manifest.files}
    asset = release.asset_name(VERSION)
    assert kinds == {
        f"llmgw/download/v{VERSION}/{asset}": "llmgw",
        f"llmgw/download/v{VERSION}/SHA256SUMS": "llmgw-sums",
        f"llmgw/download/v{VERSION}/SHA256SUMS.sig": "llmgw-signature",
        f"llama.cpp/download/{ENGINE_TAG}/{sources.engine_asset}": "engine",
        f"hf/org/tiny-GGUF/{GGUF}": "model",
        "hf/org/tiny-st/model.safetensors": "model",
        "hf/org/tiny-st/config.json": "model",
    }
    by_path = {f.path: f for f in manifest.files}
    gguf = by_path[f"hf/org/tiny-GGUF/{GGUF}"]
    assert gguf.sha256 == hub.repos["org/tiny-GGUF"][GGUF].sha256 and gguf.hub_sha256
    assert not by_path["hf/org/tiny-st/config.json"].hub_sha256  # the hub lists no sha256
    for f in manifest.files:
        assert hashlib.sha256((made.path / f.path).read_bytes()).hexdigest() == f.sha256

    mirror = tmp_path / "data" / "mirror"
    done = import_bundle(made.path, mirror, keys=sources.keys)
    assert done.files == 7
    index = read_index(mirror)
    assert index is not None and {f.path for f in index.files} == set(kinds)
    for f in index.files:
        assert (mirror / f.path).read_bytes() == (made.path / f.path).read_bytes()
    # Nothing but the files and the index: no staging left behind.
    assert not [p for p in (tmp_path / "data").iterdir() if p.name != "mirror"]


async def test_a_tar_bundle_is_checked_against_the_manifest_digest_carried_apart(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    made = await create(plan(sources, hub.endpoint, tmp_path / "b.tar", models=["hf:org/tiny-st"]))
    with tarfile.open(made.path) as tar:
        member = tar.extractfile(MANIFEST)
        assert member is not None
        assert hashlib.sha256(member.read()).hexdigest() == made.manifest_sha256
    mirror = tmp_path / "mirror"
    with pytest.raises(BundleError, match="carried apart"):
        import_bundle(made.path, mirror, keys=sources.keys, manifest_sha256="0" * 64)
    assert not mirror.exists()
    import_bundle(made.path, mirror, keys=sources.keys, manifest_sha256=made.manifest_sha256)
    assert (mirror / "hf/org/tiny-st/model.safetensors").is_file()


async def test_a_changed_file_is_refused_by_name_and_the_mirror_is_untouched(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    mirror = tmp_path / "mirror"
    first = await create(plan(sources, hub.endpoint, tmp_path / "one", models=["hf:org/tiny-st"]))
    import_bundle(first.path, mirror, keys=sources.keys)
    before = {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()}

    made = await create(plan(sources, hub.endpoint, tmp_path / "two"))
    victim = made.path / "hf/org/tiny-GGUF" / GGUF
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"hf/org/tiny-GGUF/{GGUF}: sha256 .* not the manifest"):
        import_bundle(made.path, mirror, keys=sources.keys)
    assert {p: p.read_bytes() for p in mirror.rglob("*") if p.is_file()} == before


async def test_a_release_not_signed_by_a_trusted_key_is_refused(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    made = await create(plan(sources, hub.endpoint, tmp_path / "bundle", models=[]))
    mirror = tmp_path / "mirror"
    # Signed by the test's key; this llmgw trusts only its own.
    with pytest.raises(BundleError, match="not signed by a key this llmgw trusts"):
        import_bundle(made.path, mirror)
    assert not mirror.exists()


async def test_an_engine_archive_unlike_its_pin_is_refused(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    made = await create(plan(sources, hub.endpoint, tmp_path / "bundle", models=[]))
    pins = {"llama.cpp": {"version": ENGINE_TAG, "sha256": {sources.engine_asset: "a" * 64}}}
    with pytest.raises(BundleError, match=f"{sources.engine_asset}: sha256 .* not the pinned"):
        import_bundle(made.path, tmp_path / "mirror", keys=sources.keys, pins=pins)
    assert not (tmp_path / "mirror").exists()


async def test_creating_refuses_a_file_unlike_the_hubs_hash(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    hub.repos["org/tiny-st"]["model.safetensors"].published_sha = "b" * 64
    with pytest.raises(BundleError, match="model.safetensors: sha256 .* not the hub's"):
        await create(plan(sources, hub.endpoint, tmp_path / "bundle", models=["hf:org/tiny-st"]))
    assert not (tmp_path / "bundle").exists()
    assert list(tmp_path.iterdir()) == [tmp_path / "sources"]  # no staging left


async def test_creating_refuses_an_engine_unlike_what_its_source_publishes(
    sources: Sources, hub: FakeHub, tmp_path: Path
) -> None:
    sources.engines.publish(ENGINE_TAG, {"llama-server": b"x"}, checksum="c" * 64)
    with pytest.raises(BundleError, match="is not the published"):
        await create(plan(sources, hub.endpoint, tmp_path / "bundle", models=[]))


def _tar(path: Path, members: dict[str, bytes], link: tuple[str, str] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type = tarfile.SYMTYPE
            info.linkname = link[1]
            tar.addfile(info)
    return path


def _manifest_bytes() -> bytes:
    return json.dumps({"format": 1, "created": 0, "llmgw_version": VERSION, "files": []}).encode()


@pytest.mark.parametrize("name", ["../outside", "/etc/llmgw-owned", "hf/../../outside"])
def test_a_tar_member_escaping_the_bundle_is_refused(tmp_path: Path, name: str) -> None:
    bundle = _tar(tmp_path / "b.tar", {MANIFEST: _manifest_bytes(), name: b"gotcha"})
    data = tmp_path / "data"
    with pytest.raises(BundleError, match="would land outside the bundle"):
        import_bundle(bundle, data / "mirror")
    assert not (tmp_path / "outside").exists()
    assert list(data.iterdir()) == []  # neither a mirror nor the unpacking left behind


def test_a_tar_holding_a_link_is_refused(tmp_path: Path) -> None:
    bundle = _tar(tmp_path / "b.tar", {MANIFEST: _manifest_bytes()}, link=("hf", "/etc"))
    with pytest.raises(BundleError, match="is a link or special file"):
        import_bundle(bundle, tmp_path / "data" / "mirror")


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "hf/org/x").mkdir(parents=True)
    (bundle / "hf/org/x/extra.bin").write_bytes(b"pickle")
    (bundle / MANIFEST).write_bytes(_manifest_bytes())
    with pytest.raises(BundleError, match="hf/org/x/extra.bin is in the bundle but not in its"):
        import_bundle(bundle, tmp_path / "mirror")


def test_a_manifest_entry_pointing_outside_is_refused(tmp_path: Path) -> None:
    from llmgw.offline.manifest import BundleFile, Manifest

    entry = BundleFile(
        path="hf/../../x", kind="model", sha256="0" * 64, size=0, origin="", repo="a/b"
    )
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / MANIFEST).write_bytes(dump_manifest(Manifest(1, 0.0, VERSION, [entry])))
    with pytest.raises(BundleError, match="leaves the bundle"):
        import_bundle(bundle, tmp_path / "mirror")


def test_a_file_reached_through_a_link_out_of_the_bundle_is_refused(tmp_path: Path) -> None:
    from llmgw.offline.manifest import BundleFile, Manifest

    outside = tmp_path / "elsewhere"
    (outside / "x").mkdir(parents=True)
    (outside / "x/m.gguf").write_bytes(b"secret")
    bundle = tmp_path / "bundle"
    (bundle / "hf").mkdir(parents=True)
    (bundle / "hf/org").symlink_to(outside)
    entry = BundleFile(
        path="hf/org/x/m.gguf",
        kind="model",
        sha256=hashlib.sha256(b"secret").hexdigest(),
        size=6,
        origin="",
        repo="org/x",
        repo_path="m.gguf",
    )
    (bundle / MANIFEST).write_bytes(dump_manifest(Manifest(1, 0.0, VERSION, [entry])))
    with pytest.raises(BundleError, match="lies outside the bundle"):
        import_bundle(bundle, tmp_path / "mirror")
    assert not (tmp_path / "mirror").exists()
