"""Release archives built by the tests, and a loopback release mirror in GitHub's
layout (``/OWNER/REPO/releases/download/TAG/ASSET``, ``.../releases/latest``
redirecting to ``.../releases/tag/TAG``, and the API's release with asset digests)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

# What llama-server --version prints (to stderr), and its refusal of anything else.
FAKE_SERVER = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "version: 1234 (abcdef0)" >&2
  echo "built with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu" >&2
  exit 0
fi
echo "error: invalid argument: $1" >&2
exit 1
"""

BROKEN_SERVER = """#!/bin/sh
echo "llama-server: error while loading shared libraries: libllama.so:" \
  "cannot open shared object file: No such file or directory" >&2
exit 127
"""


@dataclass
class Member:
    name: str
    data: bytes = b""
    mode: int = 0o644
    kind: str = "file"  # file, dir, symlink, hardlink, fifo
    target: str = ""


def server_member(name: str = "build/bin/llama-server", script: str = FAKE_SERVER) -> Member:
    return Member(name, script.encode(), 0o755)


def tar_gz(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.mode = m.mode
            info.mtime = int(time.time())
            if m.kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
            elif m.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, m.target
            elif m.kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, m.target
            elif m.kind == "fifo":
                info.type = tarfile.FIFOTYPE
            if m.kind == "file":
                info.size = len(m.data)
                tf.addfile(info, io.BytesIO(m.data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def zip_bytes(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for m in members:
            info = zipfile.ZipInfo(m.name + ("/" if m.kind == "dir" else ""))
            info.create_system = 3  # Unix, so the mode bits are read
            if m.kind == "symlink":
                info.external_attr = (0o120777 << 16) & 0xFFFF0000
                zf.writestr(info, m.target)
            elif m.kind == "dir":
                info.external_attr = (0o40755 << 16) | 0x10
                zf.writestr(info, b"")
            else:
                info.external_attr = ((0o100000 | m.mode) << 16) & 0xFFFF0000
                zf.writestr(info, m.data)
    return buf.getvalue()


def release_tar(script: str = FAKE_SERVER, extra: list[Member] | None = None) -> bytes:
    return tar_gz(
        [
            Member("build", kind="dir"),
            Member("build/bin", kind="dir"),
            server_member(script=script),
            Member("build/bin/libllama.so.0", b"\x7fELF fake", 0o755),
            Member("build/bin/libllama.so", kind="symlink", target="libllama.so.0"),
            *(extra or []),
        ]
    )


class Mirror:
    """Serves published assets; counts requests; can leave out Content-Length."""

    REPO = "ggml-org/llama.cpp"

    def __init__(self) -> None:
        self.base = ""
        self.files: dict[str, bytes] = {}
        self.api: dict[str, Any] = {}
        self.latest = "b1234"
        self.chunked = False
        self.requests: list[str] = []

    @property
    def source(self) -> str:
        return f"{self.base}/{self.REPO}/releases"

    def publish(
        self, tag: str, asset: str, data: bytes, *, sha_text: str | None = None, sha: bool = True
    ) -> str:
        digest = hashlib.sha256(data).hexdigest()
        prefix = f"/{self.REPO}/releases/download/{tag}/"
        self.files[prefix + asset] = data
        if sha:
            text = sha_text if sha_text is not None else f"{digest}  {asset}\n"
            self.files[prefix + asset + ".sha256"] = text.encode()
        release = self.api.setdefault(tag, {"tag_name": tag, "assets": []})
        release["assets"].append({"name": asset, "digest": f"sha256:{digest}"})
        return digest

    def count(self, suffix: str) -> int:
        return sum(1 for path in self.requests if path.endswith(suffix))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests.append(path)
        if path == f"/{self.REPO}/releases/latest":
            raise web.HTTPFound(f"/{self.REPO}/releases/tag/{self.latest}")
        if path.startswith(f"/{self.REPO}/releases/tag/"):
            return web.Response(text="<html>release page</html>", content_type="text/html")
        api = f"/api/repos/{self.REPO}/releases/tags/"
        if path.startswith(api) and path[len(api) :] in self.api:
            return web.json_response(self.api[path[len(api) :]])
        data = self.files.get(path)
        if data is None:
            return web.Response(status=404, text="Not Found")
        if not self.chunked:
            return web.Response(body=data, content_type="application/octet-stream")
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(data), 100):
            await resp.write(data[i : i + 100])
        await resp.write_eof()
        return resp


@pytest.fixture
async def mirror() -> AsyncIterator[Mirror]:
    m = Mirror()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", m.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    m.base = f"http://{host}:{port}"
    yield m
    await runner.cleanup()


def marker(directory: Any) -> dict[str, Any]:
    return dict(json.loads((directory / "installed.json").read_text()))
