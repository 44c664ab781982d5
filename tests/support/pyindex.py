"""Stand-in engine wheels and a loopback Python package index for the tests.

``standin_wheel`` builds a real pure-Python wheel for ``vllm`` or ``sglang``: a module
that says its version, and for vLLM a ``vllm`` console script standing in for the
engine's CLI (``--version`` prints the version; ``serve ...`` prints its arguments and
exits 0). SGLang's stand-in has ``sglang.launch_server``, printing its arguments.

``PackageIndex`` serves such wheels as a PEP 503 "simple" index on 127.0.0.1, so an
installer pointed at it with ``--index-url`` never reaches PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

_VLLM_CLI = """\
import sys

from vllm import __version__


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--version"]:
        print(__version__)
        return 0
    if args[:1] == ["serve"]:
        print("vllm " + " ".join(args))
        return 0
    print("usage: vllm [--version] serve MODEL ...", file=sys.stderr)
    return 2
"""

_SGLANG_LAUNCH = """\
import sys

print("sglang.launch_server " + " ".join(sys.argv[1:]))
"""


def normalise(name: str) -> str:
    """A project name as PEP 503 spells it in index paths."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def standin_wheel(dist: str, version: str, *, reports: str | None = None) -> tuple[str, bytes]:
    """``(filename, bytes)`` of a wheel of ``dist`` (vllm or sglang) at ``version`` whose
    module says it is ``reports`` (``version`` unless given)."""
    pkg = dist.replace("-", "_")
    said = reports if reports is not None else version
    files: dict[str, str] = {f"{pkg}/__init__.py": f'__version__ = "{said}"\n'}
    entry_points = ""
    if dist == "vllm":
        files[f"{pkg}/cli.py"] = _VLLM_CLI
        entry_points = "[console_scripts]\nvllm = vllm.cli:main\n"
    elif dist == "sglang":
        files[f"{pkg}/launch_server.py"] = _SGLANG_LAUNCH
    else:
        raise ValueError(f"no stand-in for {dist!r}")
    info = f"{pkg}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        "Summary: a stand-in for the tests\n"
    )
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: llmgw-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/entry_points.txt"] = entry_points
    record = [
        f"{name},{_record_hash(text.encode())},{len(text.encode())}" for name, text in files.items()
    ]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return f"{pkg}-{version}-py3-none-any.whl", buf.getvalue()


class PackageIndex:
    """A PEP 503 simple index on 127.0.0.1 in a thread: ``/simple/`` lists projects,
    ``/simple/{project}/`` links each file with its ``#sha256=``, ``/files/{name}``
    serves it. ``requests`` records every path asked for."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self._lock = threading.Lock()
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                index._serve(self)

            def do_HEAD(self) -> None:  # noqa: N802
                index._serve(self, head=True)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/simple"

    def add(self, filename: str, data: bytes) -> None:
        with self._lock:
            self.files[filename] = data

    def projects(self) -> dict[str, list[str]]:
        with self._lock:
            names = sorted(self.files)
        found: dict[str, list[str]] = {}
        for name in names:
            found.setdefault(normalise(name.split("-", 1)[0]), []).append(name)
        return found

    def _serve(self, req: BaseHTTPRequestHandler, head: bool = False) -> None:
        path = req.path.split("?", 1)[0]
        with self._lock:
            self.requests.append(path)
        parts = [p for p in path.split("/") if p]
        body: bytes | None = None
        ctype = "text/html; charset=utf-8"
        projects = self.projects()
        if parts == ["simple"]:
            links = "".join(f'<a href="{p}/">{p}</a>\n' for p in projects)
            body = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        elif len(parts) == 2 and parts[0] == "simple" and parts[1] in projects:
            links = ""
            for name in projects[parts[1]]:
                digest = hashlib.sha256(self.files[name]).hexdigest()
                quoted = html.escape(name)
                links += f'<a href="../../files/{quoted}#sha256={digest}">{quoted}</a>\n'
            body = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        elif len(parts) == 2 and parts[0] == "files" and parts[1] in self.files:
            body, ctype = self.files[parts[1]], "application/octet-stream"
        if body is None:
            req.send_error(404)
            return
        req.send_response(200)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if not head:
            req.wfile.write(body)

    def __enter__(self) -> PackageIndex:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
