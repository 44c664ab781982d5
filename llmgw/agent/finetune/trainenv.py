"""What the trainer runs with on a node: a Python environment with pinned PyTorch,
transformers, PEFT and the rest, made with uv, llama.cpp's LoRA-to-GGUF conversion
scripts at the llama.cpp version the fleet runs, and the trainer script itself.

Environment: ``ensure_env(root)`` makes ``{root}/env-{PINHASH}/`` with ``uv venv``
(this agent's own Python, never one uv would download) and ``uv pip install`` of
``PINS``, checks that the environment imports every package, and only then writes
``trainenv.json`` (the pins) into it; a directory without that marker, or whose
marker names other pins, is not the environment and is made again. The pins change
the directory's name, so an llmgw upgrading them makes a new environment beside the
old one. uv's cache is ``{root}/.uv-cache``. PyTorch comes from the package index
(PyPI's Linux build runs on the CPU and on NVIDIA cards); ``torch_backend`` (uv's
``--torch-backend``: ``auto``, ``cpu``, ``cu129``...) picks a build from PyTorch's own
index instead, where the node reaches it.

Pins: the versions llama.cpp's own conversion requirements name (torch 2.11.0,
transformers 4.57.6, protobuf below 5, numpy 2.2) and the PEFT, accelerate and
safetensors releases of the same months, so the trainer and the conversion share one
environment.

Conversion scripts: ``ensure_converter(root, version)`` puts ``convert_lora_to_gguf.py``,
``convert_hf_to_gguf.py``, their ``conversion/`` package and ``gguf-py/`` of llama.cpp
``version`` (the fleet's pin, ``LLAMACPP_PIN``, by default) under
``{root}/llama.cpp-{version}/`` and answers the path of ``convert_lora_to_gguf.py``.
They come from ``source``: the tag's source archive on GitHub by default, or another
URL, or a path on the node (an archive, or a directory holding a llama.cpp tree) for a
node without GitHub. Anything in the archive that would leave its directory refuses it
(``engines/archive.unpack``).

The environment and scripts are written by the agent and readable by everyone, so the
trainer can run as the engines' user.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TypedDict

import aiohttp

from llmgw.agent import command
from llmgw.agent.engines.archive import ArchiveError, unpack
from llmgw.agent.engines.pyinstall import find_uv
from llmgw.enginepins import LLAMACPP_PIN

PINS = (
    "torch==2.11.0",
    "transformers==4.57.6",
    "peft==0.18.1",
    "accelerate==1.12.0",
    "safetensors==0.7.0",
    "tokenizers==0.22.2",
    "gguf==0.19.0",
    "sentencepiece==0.2.1",
    "protobuf==4.25.9",
    "numpy==2.2.6",
)
# What the environment must import before it is called made.
IMPORT_CHECK = "import torch, transformers, peft, accelerate, safetensors, tokenizers, gguf"
ENV_MARKER = "trainenv.json"
CONVERTER_MARKER = "converter.json"
# The parts of a llama.cpp tree the LoRA conversion reads (and the full-model one, which
# the tests use to make a base GGUF).
CONVERTER_PARTS = ("convert_lora_to_gguf.py", "convert_hf_to_gguf.py", "conversion", "gguf-py")
SOURCE_URL = "https://github.com/ggml-org/llama.cpp/archive/refs/tags/{version}.tar.gz"
CHECK_TIMEOUT = 300.0  # importing PyTorch on a busy node is slow
MAX_ARCHIVE = 1 << 30  # a llama.cpp source archive is ~30 MB; far past that is not one


class TrainEnvError(RuntimeError):
    """The environment or the conversion scripts could not be made; the message says
    what failed and what to do."""


class EnvMarker(TypedDict):
    pins: list[str]
    python: str
    torch_backend: str | None
    index_url: str | None
    made_at: float


class ConverterMarker(TypedDict):
    version: str
    source: str
    made_at: float


def _quiet(words: str) -> None:
    pass


def pin_hash(pins: tuple[str, ...] = PINS) -> str:
    """Twelve hex digits naming these pins: the environment's directory."""
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]


def env_directory(root: Path, pins: tuple[str, ...] = PINS) -> Path:
    return root / f"env-{pin_hash(pins)}"


def trainer_script() -> bytes:
    """``trainer.py``, for the runner to write into a job's directory and run with the
    environment's Python (it imports nothing of llmgw; read through importlib, so it
    works from the zipapp too)."""
    return resources.files("llmgw.agent.finetune").joinpath("trainer.py").read_bytes()


_locks: dict[Path, asyncio.Lock] = {}


def _lock(directory: Path) -> asyncio.Lock:
    return _locks.setdefault(directory, asyncio.Lock())


# --- the environment ----------------------------------------------------------------


def _env_ready(directory: Path, pins: tuple[str, ...]) -> bool:
    try:
        marker: EnvMarker = json.loads((directory / ENV_MARKER).read_text())
    except (OSError, ValueError):
        return False
    python = directory / "venv" / "bin" / "python"
    return marker.get("pins") == list(pins) and python.exists()


async def ensure_env(
    root: Path,
    *,
    pins: tuple[str, ...] = PINS,
    python: str | None = None,
    uv: str | None = None,
    index_url: str | None = None,
    torch_backend: str | None = None,
    progress: Callable[[str], None] = _quiet,
    timeout: float = 3600.0,
) -> Path:
    """The environment's Python: the one already made with these pins, otherwise made
    now. TrainEnvError says why when it cannot be made."""
    directory = env_directory(root, pins)
    async with _lock(directory):
        if _env_ready(directory, pins):
            return directory / "venv" / "bin" / "python"
        staging = directory.with_name(f".{directory.name}.making")
        try:
            async with asyncio.timeout(timeout):
                await _make_env(
                    staging, pins, python, uv, index_url, torch_backend, progress, timeout
                )
            await asyncio.to_thread(_replace, staging, directory)
        except TimeoutError:
            raise TrainEnvError(
                f"making the trainer's environment did not finish in {timeout:.0f}s; check "
                "this node's connection to the package index and try again"
            ) from None
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        marker: EnvMarker = {
            "pins": list(pins),
            "python": python or sys.executable,
            "torch_backend": torch_backend,
            "index_url": index_url,
            "made_at": time.time(),
        }
        _write_json(directory / ENV_MARKER, marker)
        progress("trainer environment ready")
        return directory / "venv" / "bin" / "python"


async def _make_env(
    staging: Path,
    pins: tuple[str, ...],
    python: str | None,
    uv: str | None,
    index_url: str | None,
    torch_backend: str | None,
    progress: Callable[[str], None],
    timeout: float,
) -> None:
    uv = uv or find_uv()
    if uv is None or not (os.path.isfile(uv) and os.access(uv, os.X_OK)):
        raise TrainEnvError(
            "making the trainer's environment needs uv; install it on this node: "
            "pip install uv, or your distribution's package"
        )
    await asyncio.to_thread(shutil.rmtree, staging, True)  # a crashed attempt's leftovers
    staging.parent.mkdir(parents=True, exist_ok=True)
    env = {
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_CACHE_DIR": str(staging.parent / ".uv-cache"),
        "NO_COLOR": "1",
    }
    venv = staging / "venv"
    progress("trainer environment: making it")
    argv = [uv, "venv", "--relocatable", "--python", python or sys.executable, str(venv)]
    await _run(argv, "make the environment", env, timeout)
    argv = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), *pins]
    if torch_backend:
        argv += ["--torch-backend", torch_backend]
    if index_url:
        argv += ["--index-url", index_url]
    progress(f"trainer environment: uv pip install {' '.join(pins)}")
    await _run(argv, "install the trainer's packages", env, timeout)
    progress("trainer environment: checking that it imports PyTorch, transformers and PEFT")
    python_argv = [str(venv / "bin" / "python"), "-c", IMPORT_CHECK]
    await _run(python_argv, "import them", {}, CHECK_TIMEOUT)


async def _run(argv: list[str], doing: str, env: dict[str, str], limit: float) -> None:
    """Run one step; the caller's own timeout bounds them all, ``limit`` this one."""
    try:
        done = await command.run(argv, limit, env=env)
    except TimeoutError:
        name = os.path.basename(argv[0])
        raise TrainEnvError(f"{name} could not {doing} in {limit:.0f}s") from None
    except OSError as exc:
        raise TrainEnvError(f"{argv[0]} cannot be run: {exc.strerror or exc}") from exc
    if done.code != 0:
        tail = " | ".join(line for line in done.out.splitlines() if line.strip())[-600:]
        raise TrainEnvError(f"could not {doing} (exit {done.code}): {tail}")


# --- llama.cpp's conversion scripts --------------------------------------------------


def converter_directory(root: Path, version: str) -> Path:
    return root / f"llama.cpp-{version}"


async def ensure_converter(
    root: Path,
    version: str = LLAMACPP_PIN,
    *,
    source: str | None = None,
    progress: Callable[[str], None] = _quiet,
) -> Path:
    """``convert_lora_to_gguf.py`` of llama.cpp ``version``: the copy already here, or
    fetched now from ``source`` (a URL or a path on this node; the tag's GitHub source
    archive when None)."""
    if not version or "/" in version or version.startswith("."):
        raise TrainEnvError(f"{version!r} is not a llama.cpp version (a tag like b6000)")
    directory = converter_directory(root, version)
    script = directory / CONVERTER_PARTS[0]
    async with _lock(directory):
        if (directory / CONVERTER_MARKER).is_file() and script.is_file():
            return script
        where = source or SOURCE_URL.format(version=version)
        staging = directory.with_name(f".{directory.name}.making")
        await asyncio.to_thread(shutil.rmtree, staging, True)
        staging.mkdir(parents=True)
        try:
            progress(f"llama.cpp {version} conversion scripts: from {where}")
            if where.startswith(("http://", "https://")):
                archive = staging / "source.archive"
                await _download(where, archive)
                tree = await asyncio.to_thread(_unpack_tree, archive, staging / "unpacked")
            elif Path(where).is_dir():
                tree = _llama_tree(Path(where))
            elif Path(where).is_file():
                tree = await asyncio.to_thread(_unpack_tree, Path(where), staging / "unpacked")
            else:
                raise TrainEnvError(
                    f"the conversion scripts' source {where} is neither a URL nor a file or "
                    "directory on this node; name a llama.cpp source archive or tree"
                )
            await asyncio.to_thread(_take_parts, tree, staging / "llama.cpp")
            await asyncio.to_thread(_replace, staging / "llama.cpp", directory)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        marker: ConverterMarker = {"version": version, "source": where, "made_at": time.time()}
        _write_json(directory / CONVERTER_MARKER, marker)
        return script


async def _download(url: str, path: Path) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url) as answer,
        ):
            if answer.status != 200:
                raise TrainEnvError(
                    f"fetching {url} answered HTTP {answer.status}; check the llama.cpp "
                    "version, or name a reachable copy of its source archive"
                )
            size = 0
            with path.open("wb") as out:
                async for chunk in answer.content.iter_chunked(1 << 20):
                    size += len(chunk)
                    if size > MAX_ARCHIVE:
                        raise TrainEnvError(f"{url} is past {MAX_ARCHIVE >> 20} MiB: not a source")
                    out.write(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TrainEnvError(
            f"could not fetch {url}: {exc or type(exc).__name__}; name a reachable copy of "
            "llama.cpp's source archive, or a path on this node"
        ) from exc


def _unpack_tree(archive: Path, dest: Path) -> Path:
    try:
        unpack(archive, dest)
    except ArchiveError as exc:
        raise TrainEnvError(f"{archive.name} is refused: {exc}") from exc
    return _llama_tree(dest)


def _llama_tree(top: Path, depth: int = 4) -> Path:
    """The shallowest directory under ``top`` holding ``convert_lora_to_gguf.py``: the
    tree's root in GitHub's archive (``llama.cpp-b6000/``), a checkout, or a package
    that vendors llama.cpp."""
    level = [top]
    for _ in range(depth):
        for directory in level:
            if (directory / CONVERTER_PARTS[0]).is_file():
                return directory
        level = [d for parent in level for d in sorted(parent.iterdir()) if d.is_dir()]
    raise TrainEnvError(
        f"no convert_lora_to_gguf.py in {top.name}: it is not a llama.cpp source tree"
    )


def _take_parts(tree: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for part in CONVERTER_PARTS:
        source = tree / part
        if not source.exists():
            raise TrainEnvError(f"the llama.cpp tree has no {part}; it is too old to convert")
        if source.is_dir():
            shutil.copytree(source, dest / part, symlinks=False)
        else:
            shutil.copy2(source, dest / part)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _replace(staging: Path, directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    staging.rename(directory)


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.rename(path)
