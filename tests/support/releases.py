"""llmgw releases for tests: zipapps of any version that trust the test's key, published
in GitHub's release layout and served from loopback by a server that can misbehave.

``versioned_zipapp`` rewrites a copy of the suite's zipapp (``make zipapp``'s) instead of
building again: the same code with another ``__version__``, another trusted key
(``llmgw/releasekey.py``) and another shiv build id (shiv unpacks each build id once, so
two versions must not share one). Seconds, where a build takes a minute.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from llmgw import release
from tests.support.ports import free_port

PACKAGE = "site-packages/llmgw/"


def signing_key() -> tuple[bytes, str]:
    """A fresh Ed25519 key: its PEM private half and the base64 public key to trust."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem, release.public_key_of(pem)


def versioned_zipapp(
    base: Path, version: str, public_key: str, out: Path, *, main: str | None = None
) -> Path:
    """A copy of ``base`` that says ``version`` and trusts ``public_key`` alone.
    ``main``: another ``__main__.py`` (a release that does not start, say)."""
    data = base.read_bytes()
    start = data.index(b"PK\x03\x04")  # after the shebang line
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(base) as src, out.open("wb") as fh:
        fh.write(data[:start])
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                body = src.read(info)
                if info.filename == PACKAGE + "__init__.py":
                    body = re.sub(
                        rb'^__version__ = "[^"]*"$',
                        f'__version__ = "{version}"'.encode(),
                        body,
                        flags=re.MULTILINE,
                    )
                elif info.filename == PACKAGE + "releasekey.py":
                    body = re.sub(
                        rb"^PUBLIC_KEYS: tuple\[str, \.\.\.\] = .*$",
                        f'PUBLIC_KEYS: tuple[str, ...] = ("{public_key}",)'.encode(),
                        body,
                        flags=re.MULTILINE,
                    )
                elif info.filename == "environment.json":
                    env = json.loads(body)
                    env["build_id"] = hashlib.sha256(
                        f"{env['build_id']}:{version}:{public_key}:{main}".encode()
                    ).hexdigest()
                    body = json.dumps(env).encode()
                elif info.filename == "__main__.py" and main is not None:
                    body = main.encode()
                info.compress_type = zipfile.ZIP_STORED  # no deflating again: seconds
                dst.writestr(info, body)
    out.chmod(0o755)
    return out


def publish(
    root: Path,
    version: str,
    zipapps: Mapping[str, Path],
    private_pem: bytes,
    *,
    tamper: str | None = None,
) -> Path:
    """Write release ``version`` under ``root`` in GitHub's layout (``root`` is then the
    release source): ``{tag: zipapp}`` as ``llmgw-V-TAG.pyz`` with its ``.sha256``,
    ``SHA256SUMS`` and its signature. ``tamper``: ``"signature"`` (signed by another
    key) or ``"checksum"`` (the asset's bytes changed after signing)."""
    where = root / "download" / f"v{version}"
    where.mkdir(parents=True, exist_ok=True)
    digests: dict[str, str] = {}
    for tag, pyz in zipapps.items():
        name = release.asset_name(version, tag)
        body = pyz.read_bytes()
        (where / name).write_bytes(body)
        digests[name] = hashlib.sha256(body).hexdigest()
        (where / f"{name}.sha256").write_text(f"{digests[name]}  {name}\n")
    sums = release.format_sums(digests)
    (where / release.SUMS).write_bytes(sums)
    signer = signing_key()[0] if tamper == "signature" else private_pem
    (where / release.SIGNATURE).write_bytes(release.sign(sums, signer))
    if tamper == "checksum":
        for name in digests:
            with (where / name).open("ab") as fh:
                fh.write(b"\0")
    return where


@dataclass
class ReleaseServer:
    """A loopback HTTP server of a release tree. ``mode``: ``ok``; ``garbage`` (every
    file answered with noise); ``stall`` (headers, then nothing); ``404``."""

    root: Path
    mode: str = "ok"
    port: int = field(default_factory=free_port)
    requests: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @contextmanager
    def running(self) -> Iterator[ReleaseServer]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                path = (server.root / self.path.lstrip("/")).resolve()
                inside = path.is_relative_to(server.root.resolve())
                if server.mode == "404" or not inside or not path.is_file():
                    self.send_error(404)
                    return
                body = path.read_bytes()
                if server.mode == "garbage":
                    body = b"<html>not what you asked for</html>\n" * 8
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                if server.mode == "stall":
                    self.wfile.flush()
                    time.sleep(30)
                    return
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            httpd.shutdown()
            httpd.server_close()
