"""``llmgw bundle create|import`` and ``server init --bundle`` on the command line, with
the release keys built into llmgw (the tests' releases are signed by another)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llmgw import cli
from llmgw.config import ServerConfig, load
from llmgw.offline.manifest import MANIFEST, BundleFile, Manifest, dump_manifest
from tests.support.bundles import VERSION, Sources


def models_only_bundle(root: Path) -> Path:
    """A bundle of one model file (no llmgw release: nothing to sign)."""
    data = b"GGUF" + bytes(100)
    path = "hf/org/m/m.gguf"
    (root / "hf/org/m").mkdir(parents=True)
    (root / path).write_bytes(data)
    entry = BundleFile(
        path=path,
        kind="model",
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        origin="https://huggingface.co/org/m/resolve/main/m.gguf",
        repo="org/m",
        repo_path="m.gguf",
        hub_sha256=True,
    )
    (root / MANIFEST).write_bytes(dump_manifest(Manifest(1, 0.0, VERSION, [entry], ["hf:org/m"])))
    return root


def test_create_refuses_a_release_this_llmgw_does_not_trust(
    sources: Sources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b.tar"
    argv = ["bundle", "create", "-o", str(out), "--llmgw-source", sources.releases.url]
    rc = cli.main([*argv, "--llmgw-version", VERSION, "--engines"])
    assert rc == 1
    assert "not signed by a key this llmgw trusts" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [tmp_path / "sources"]  # nothing half made


def test_server_init_with_a_bundle_fills_and_serves_the_mirror(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = models_only_bundle(tmp_path / "bundle")
    data = tmp_path / "data"
    argv = ["server", "init", "--data-dir", str(data), "--listen", "127.0.0.1:18080", "--yes"]
    assert cli.main([*argv, "--bundle", str(bundle)]) == 0
    assert "offline.mirror is set" in capsys.readouterr().out
    assert load(ServerConfig, data / "server.yaml").offline.mirror
    assert (data / "mirror/hf/org/m/m.gguf").read_bytes() == (
        bundle / "hf/org/m/m.gguf"
    ).read_bytes()


def test_import_names_the_changed_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = models_only_bundle(tmp_path / "bundle")
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.yaml").write_text("listen: 127.0.0.1:8080\n")
    (bundle / "hf/org/m/m.gguf").write_bytes(b"GGUF" + bytes(99) + b"\1")
    assert cli.main(["bundle", "import", str(bundle), "--data-dir", str(data)]) == 1
    err = capsys.readouterr().err
    assert "hf/org/m/m.gguf: sha256" in err and "nothing was imported" in err
    assert not (data / "mirror").exists()


def test_import_wants_a_control_planes_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = models_only_bundle(tmp_path / "bundle")
    assert cli.main(["bundle", "import", str(bundle), "--data-dir", str(tmp_path)]) == 1
    assert "not a control plane's data dir" in capsys.readouterr().err
