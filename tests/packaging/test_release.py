"""``make release``'s work (packaging/release.py), run on a copy of the tree that trusts
the test's key, with llama.cpp's digests read from a loopback stand-in of GitHub's
releases API: the release layout it writes is one ``release.fetch`` takes, and every
refusal (a bad version, a foreign key, a key inside the tree, an empty Unreleased, empty
pins) leaves the copy byte for byte as it was and writes no release."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmgw import release
from llmgw.enginepins import LLAMACPP_PIN
from tests.support import releases
from tests.support.ports import free_port
from tests.support.releases import ReleaseServer

REPO = Path(__file__).resolve().parents[2]
HEX = "cd" * 32
ARCHIVE = f"llama-{LLAMACPP_PIN}-bin-ubuntu-x64.tar.gz"
TAG = "py311-linux-x86_64"


@dataclass
class FakeApi:
    """GitHub's ``/repos/ggml-org/llama.cpp/releases`` as far as pin-engines reads it."""

    assets: list[dict[str, str]]
    url: str = ""


@pytest.fixture
def api() -> Iterator[FakeApi]:
    fake = FakeApi(assets=[{"name": ARCHIVE, "digest": f"sha256:{HEX}"}])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != f"/releases/tags/{LLAMACPP_PIN}":
                self.send_error(404)
                return
            body = json.dumps({"tag_name": LLAMACPP_PIN, "assets": fake.assets}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    port = free_port()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{port}/releases"
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, bytes, str]:
    """A copy of what a release reads and writes, trusting a fresh test key; the key's
    PEM lies outside the copy."""
    copy = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "llmgw", copy / "llmgw", ignore=ignore)
    shutil.copytree(REPO / "packaging", copy / "packaging", ignore=ignore)
    for name in ("pyproject.toml", "Makefile", "CHANGELOG.md"):
        shutil.copy2(REPO / name, copy / name)
    pem, public = releases.signing_key()
    keyfile = copy / "llmgw" / "releasekey.py"
    text, count = re.subn(
        r"^PUBLIC_KEYS: tuple\[str, \.\.\.\] = \(",
        f'PUBLIC_KEYS: tuple[str, ...] = ("{public}", ',
        keyfile.read_text(),
        flags=re.MULTILINE,
    )
    assert count == 1
    keyfile.write_text(text)
    # Empty pins, as the tree keeps them between releases.
    pins = copy / "llmgw" / "enginepins.py"
    pins.write_text(
        re.sub(
            r"^PINNED: .*$",
            'PINNED: dict[str, dict[str, Any]] = {"llama.cpp": {"version": LLAMACPP_PIN, '
            '"sha256": {}}}',
            pins.read_text(),
            flags=re.MULTILINE,
        )
    )
    (tmp_path / "key.pem").write_bytes(pem)
    return copy, pem, public


def cut(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(copy / "packaging" / "release.py"), *args],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )


def snapshot(copy: Path) -> dict[str, bytes]:
    return {
        p.relative_to(copy).as_posix(): p.read_bytes()
        for p in sorted(copy.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and ".ruff_cache" not in p.parts
    }


def test_a_release_is_signed_in_githubs_layout_and_fetch_takes_it(
    tree: tuple[Path, bytes, str], api: FakeApi, zipapp: Path, tmp_path: Path
) -> None:
    copy, _pem, public = tree
    before = (copy / "CHANGELOG.md").read_text()
    unreleased = before.split("## Unreleased\n", 1)[1].split("\n## ", 1)[0].strip()
    assert unreleased, "the tree's CHANGELOG.md has an Unreleased section to release"

    proc = cut(
        copy,
        "--version=9.8.7",
        f"--signing-key={tmp_path / 'key.pem'}",
        f"--zipapp={zipapp}",
        f"--api={api.url}",
        f"--tag={TAG}",
    )
    assert proc.returncode == 0, proc.stderr

    where = copy / "dist" / "releases" / "download" / "v9.8.7"
    asset = f"llmgw-9.8.7-{TAG}.pyz"
    assert sorted(p.name for p in where.iterdir()) == sorted(
        [asset, f"{asset}.sha256", "SHA256SUMS", "SHA256SUMS.sig"]
    )
    assert (where / asset).read_bytes() == zipapp.read_bytes()
    digest = release.sha256_file(where / asset)
    sums = (where / "SHA256SUMS").read_bytes()
    assert release.parse_sums(sums) == {asset: digest}
    assert (where / f"{asset}.sha256").read_text() == f"{digest}  {asset}\n"
    release.verify_signature(sums, (where / "SHA256SUMS.sig").read_bytes(), (public,))
    with pytest.raises(release.ReleaseError, match="not signed by a key this llmgw trusts"):
        release.verify_signature(sums, (where / "SHA256SUMS.sig").read_bytes())

    # dist/releases is a release source: fetch takes it as a node would.
    with ReleaseServer(copy / "dist" / "releases").running() as server:
        got = release.fetch(server.url, "9.8.7", tmp_path / "in", tag=TAG, keys=(public,))
    assert got.sha256 == digest and got.path.read_bytes() == zipapp.read_bytes()

    # The version, the changelog and the pins moved with it.
    init = (copy / "llmgw" / "__init__.py").read_text()
    assert re.search(r'^__version__ = "9\.8\.7"$', init, re.MULTILINE)
    after = (copy / "CHANGELOG.md").read_text()
    moved = re.search(
        r"^## Unreleased\n\n## 9\.8\.7 - (\d{4}-\d\d-\d\d)\n(.*?)\n## ", after, re.M | re.S
    )
    assert moved, after[:600]
    assert moved[2].strip() == unreleased
    assert after.count("## Unreleased") == 1
    assert after.split("## 9.8.7", 1)[1].count("## 0.1.0") == 1
    pins = (copy / "llmgw" / "enginepins.py").read_text()
    assert f'"{ARCHIVE}": "{HEX}"' in pins
    ruff = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "--check",
            "--quiet",
            str(copy / "llmgw" / "enginepins.py"),
        ],
        capture_output=True,
        text=True,
    )
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr

    # The same version twice is refused, the first left as it was.
    again = cut(
        copy,
        "--version=9.8.7",
        f"--signing-key={tmp_path / 'key.pem'}",
        f"--zipapp={zipapp}",
        f"--api={api.url}",
        "--tag=py311-linux-x86_64",
    )
    assert again.returncode == 1 and "cut already" in again.stderr
    assert (where / asset).read_bytes() == zipapp.read_bytes()


def _foreign_key(tmp_path: Path) -> Path:
    path = tmp_path / "foreign.pem"
    path.write_bytes(releases.signing_key()[0])
    return path


def _key_in_tree(tmp_path: Path) -> Path:
    inside = tmp_path / "tree" / "packaging" / "key.pem"
    shutil.copy2(tmp_path / "key.pem", inside)
    return inside


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("bad version", "is not an llmgw version"),
        ("foreign key", "is not in llmgw/releasekey.py PUBLIC_KEYS"),
        ("key in the tree", "lies inside the repository"),
        ("empty unreleased", "`## Unreleased` is empty"),
        ("empty pins", "publishes no Linux archive digests"),
        ("pins unreachable", "could not be filled in"),
    ],
)
def test_a_refused_release_changes_nothing(
    case: str,
    words: str,
    tree: tuple[Path, bytes, str],
    api: FakeApi,
    zipapp: Path,
    tmp_path: Path,
) -> None:
    copy, _pem, _public = tree
    version = "1.2.3"
    key = tmp_path / "key.pem"
    api_url = api.url
    if case == "bad version":
        version = "1.2"
    elif case == "foreign key":
        key = _foreign_key(tmp_path)
    elif case == "key in the tree":
        key = _key_in_tree(tmp_path)
    elif case == "empty unreleased":
        changelog = copy / "CHANGELOG.md"
        head, rest = changelog.read_text().split("## Unreleased\n", 1)
        changelog.write_text(f"{head}## Unreleased\n\n## {rest.split('## ', 1)[1]}")
    elif case == "empty pins":
        api.assets = [{"name": ARCHIVE}]  # no digest published
    elif case == "pins unreachable":
        api_url = f"http://127.0.0.1:{free_port()}/releases"
    before = snapshot(copy)

    proc = cut(
        copy,
        f"--version={version}",
        f"--signing-key={key}",
        f"--zipapp={zipapp}",
        f"--api={api_url}",
    )

    assert proc.returncode == 1
    assert words in proc.stderr, proc.stderr
    assert "Nothing was changed." in proc.stderr
    assert snapshot(copy) == before
    assert not (copy / "dist").exists()


def test_pin_engines_reads_github_unless_told_otherwise() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "packaging" / "pin-engines.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "https://api.github.com/repos/ggml-org/llama.cpp/releases" in proc.stdout
