"""Real engines for end-to-end tests: the cached llama-server build, published as a
llama.cpp release on a loopback mirror, and a loop thread for in-process fakes."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock

from llmgw.wire.messages import EngineInfo

REPO = Path(__file__).resolve().parents[2]
ASSET = "llama-{tag}-bin-ubuntu-x64.tar.gz"

_T = TypeVar("_T")


def llama_server_binary() -> Path:
    """The llama-server `make llama-server` builds (from cache when it is there): built by
    one worker of a run at a time, the others find it in the cache."""
    pip = str(Path(sys.executable).parent / "pip")
    # Where build-llama-server.sh keeps its builds.
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = Path(os.environ.get("LLMGW_CACHE") or xdg / "llmgw")
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache / "llama-server.lock")):
        out = subprocess.run(
            [str(REPO / "packaging" / "build-llama-server.sh"), pip],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if out.returncode != 0:
        raise RuntimeError(f"building llama-server failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


class Mirror:
    """A release source on loopback laid out as GitHub's: ``/download/{tag}/{asset}``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        handler = partial(_QuietHandler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def publish(
        self,
        tag: str,
        members: dict[str, bytes | Path],
        *,
        checksum: str | None = None,
        links: dict[str, str] | None = None,
    ) -> Path:
        """A tar.gz of ``members`` (name: bytes or a file), with its .sha256 beside it
        (the real one unless ``checksum`` says otherwise)."""
        folder = self.root / "download" / tag
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / ASSET.format(tag=tag)
        with tarfile.open(path, "w:gz") as tar:
            for name, content in members.items():
                data = content.read_bytes() if isinstance(content, Path) else content
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o755
                tar.addfile(info, io.BytesIO(data))
            for name, target in (links or {}).items():
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = target
                tar.addfile(info)
        digest = checksum or hashlib.sha256(path.read_bytes()).hexdigest()
        (folder / (path.name + ".sha256")).write_text(f"{digest}  {path.name}\n")
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class LoopThread:
    """An event loop in a thread, for aiohttp fakes that end-to-end tests drive."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float = 30) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def missing_library_binary(workdir: Path) -> Path:
    """A real ELF program linked against a library that is not there: ldd names it."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "lib.c").write_text("int llmgw_gone(void) { return 1; }\n")
    (workdir / "main.c").write_text("int llmgw_gone(void);\nint main(void){return llmgw_gone();}\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(workdir / "libllmgwgone.so"), str(workdir / "lib.c")],
        check=True,
    )
    binary = workdir / "llama-server"
    subprocess.run(
        ["cc", "-o", str(binary), str(workdir / "main.c"), f"-L{workdir}", "-lllmgwgone"],
        check=True,
    )
    (workdir / "libllmgwgone.so").unlink()
    return binary


class StandInEngines:
    """The supervisor's engine provider for a stand-in binary: every engine asked for
    is ``path`` at ``version``, as if installed."""

    def __init__(self, path: Path, version: str = "b1") -> None:
        self.path = path
        self.version = version

    async def ensure(
        self, name: str, report: Callable[[str], None], version: str | None = None
    ) -> EngineInfo:
        return EngineInfo(name=name, path=str(self.path), version=self.version)
