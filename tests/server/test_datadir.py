"""``server init --config`` (datadir.ensure): the data dir a Kubernetes pod makes or
brings up to date on every start, and ``store.dsn_file``."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from llmgw import pki
from llmgw.config import ConfigError, ServerConfig, StoreConfig, load
from llmgw.server.datadir import KEY_FILES, DataDir, InitError, ensure
from llmgw.server.store import open_store

REPO = Path(__file__).resolve().parents[2]


def _settings(path: Path, advertise: str, store: Path) -> Path:
    path.write_text(
        "listen: 127.0.0.1:18080\n"
        "agent_port: 18443\n"
        f"advertise: [{advertise}]\n"
        "ha:\n  name: llmgw-0\n"
        f"store:\n  backend: sqlite\n  dsn: {store}\n"
    )
    return path


def _admin_hashes(root: Path) -> list[str]:
    async def read() -> list[str]:
        config = load(ServerConfig, root / "server.yaml")
        store = await open_store(config, root)
        try:
            return await store.admin_token_hashes()
        finally:
            await store.close()

    return asyncio.run(read())


def _sans(cert: Path) -> list[str]:
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    ext = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return [str(v) for v in ext.value.get_values_for_type(x509.DNSName)]


def _keys_of(root: Path, into: Path) -> Path:
    """A directory as a Kubernetes Secret with the data dir's keys would be mounted."""
    into.mkdir()
    data = DataDir(root)
    sources = (data.ca_cert, data.ca_key, data.cluster_key, data.admin_token)
    for name, src in zip(KEY_FILES, sources, strict=True):
        shutil.copy(src, into / name)
    return into


def test_a_restart_keeps_keys_and_seeds_once_and_reissues_for_new_addresses(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data"
    store = tmp_path / "store.db"
    ensure(root, _settings(tmp_path / "a.yaml", "old.example.com", store))
    data = DataDir(root)
    ca, key, token = data.ca_cert.read_bytes(), data.cluster_secret(), data.admin_token
    first_token = token.read_text()
    assert "old.example.com" in _sans(data.server_cert)

    # Started again with the address agents now use (the load balancer's, known later).
    config = ensure(root, _settings(tmp_path / "b.yaml", "new.example.com", store))
    assert config.advertise == ["new.example.com"]
    assert data.ca_cert.read_bytes() == ca
    assert data.cluster_secret() == key
    assert token.read_text() == first_token
    assert "new.example.com" in _sans(data.server_cert)
    assert pki.verify_issued_by(data.server_cert.read_bytes(), ca)
    assert (root / "server.yaml").read_text() == (tmp_path / "b.yaml").read_text()
    # The store was seeded once: one admin token, the data dir's.
    assert _admin_hashes(root) == [pki.token_hash(first_token.strip())]


def test_keys_from_a_secret_open_the_store_they_seeded(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    settings = _settings(tmp_path / "s.yaml", "cp.example.com", store)
    ensure(tmp_path / "first", settings)
    keys = _keys_of(tmp_path / "first", tmp_path / "secret")

    # A pod whose data dir is new each start (an emptyDir): the same keys, the same store.
    second = tmp_path / "second"
    ensure(second, settings, keys)
    assert DataDir(second).ca_cert.read_bytes() == (keys / "ca.crt").read_bytes()
    assert (second / "admin.token").read_bytes() == (keys / "admin.token").read_bytes()
    assert (second / "admin.token").stat().st_mode & 0o077 == 0
    assert _admin_hashes(second) == [pki.token_hash((keys / "admin.token").read_text().strip())]


def test_another_clusters_keys_are_refused_with_the_store_untouched(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    settings = _settings(tmp_path / "s.yaml", "cp.example.com", store)
    ensure(tmp_path / "first", settings)
    ensure(tmp_path / "other", _settings(tmp_path / "o.yaml", "x", tmp_path / "other.db"))
    foreign = _keys_of(tmp_path / "other", tmp_path / "secret")
    before = _admin_hashes(tmp_path / "first")
    with pytest.raises(InitError, match="the store holds another cluster"):
        ensure(tmp_path / "third", settings, foreign)
    assert _admin_hashes(tmp_path / "first") == before
    assert not (tmp_path / "third" / "pki").exists()
    assert not (tmp_path / "third" / "server.yaml").exists()


def test_a_secret_missing_keys_is_named(tmp_path: Path) -> None:
    keys = tmp_path / "secret"
    keys.mkdir()
    (keys / "ca.crt").write_text("x")
    settings = _settings(tmp_path / "s.yaml", "cp", tmp_path / "store.db")
    with pytest.raises(InitError, match=r"lacks ca\.key, cluster\.key, admin\.token"):
        ensure(tmp_path / "data", settings, keys)


def test_dsn_file_is_read_at_start_and_a_missing_one_named(tmp_path: Path) -> None:
    secret = tmp_path / "dsn"
    secret.write_text("host=db dbname=llmgw user=llmgw password=s3cret\n")
    assert StoreConfig(backend="postgres", dsn_file=str(secret)).connection() == (
        "host=db dbname=llmgw user=llmgw password=s3cret"
    )
    assert StoreConfig(backend="postgres", dsn="host=a").connection() == "host=a"
    with pytest.raises(ConfigError, match=r"store\.dsn_file: cannot read .*/absent"):
        StoreConfig(backend="postgres", dsn_file=str(tmp_path / "absent")).connection()
    secret.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        StoreConfig(backend="postgres", dsn_file=str(secret)).connection()


def _init(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "server", "init", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_refuses_flags_beside_config_and_keys_alone(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "s.yaml", "cp", tmp_path / "store.db")
    both = _init("--data-dir", str(tmp_path / "d"), "--config", str(settings), "--listen", ":1")
    assert both.returncode != 0
    assert "--config takes every setting from its file" in both.stderr
    alone = _init("--data-dir", str(tmp_path / "d"), "--keys", str(tmp_path))
    assert alone.returncode != 0
    assert "--keys goes with --config" in alone.stderr
    assert not (tmp_path / "d").exists()
    ok = _init("--data-dir", str(tmp_path / "d"), "--config", str(settings))
    assert ok.returncode == 0, ok.stderr
    token = (tmp_path / "d" / "admin.token").read_text().strip()
    assert token not in ok.stdout + ok.stderr
