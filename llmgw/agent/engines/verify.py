"""Whether an engine binary can run here: ``ldd`` for the libraries it needs, named
outright with the fix when one is missing, and the engine's own ``--version``.

Nothing is reported as an engine until it has been seen to run; this is that seeing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from llmgw.agent import command
from llmgw.agent.engines.base import EngineAdapter

VERSION_TIMEOUT = 30.0

# ldd's output, or None when there is no ldd to ask (the --version run still proves it).
Ldd = Callable[[Path], Awaitable[str | None]]

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$", re.MULTILINE)
_CUDA_LIB = re.compile(r"^lib(?:cudart|cublas|cublasLt|nvrtc|curand|cufft)\.so\.(\d+)")

_PACKAGES = {
    "libgomp.so.1": "the GNU OpenMP runtime (apt install libgomp1; dnf install libgomp)",
    "libstdc++.so.6": "the C++ runtime (apt install libstdc++6; dnf install libstdc++)",
    "libgcc_s.so.1": "the GCC runtime (apt install libgcc-s1; dnf install libgcc)",
    "libvulkan.so.1": "the Vulkan loader (apt install libvulkan1; dnf install vulkan-loader)",
    "libcurl.so.4": "libcurl (apt install libcurl4; dnf install libcurl)",
    "libssl.so.3": "OpenSSL 3 (apt install libssl3; dnf install openssl-libs)",
    "libcrypto.so.3": "OpenSSL 3 (apt install libssl3; dnf install openssl-libs)",
}


class EngineCheckError(RuntimeError):
    """The binary cannot run here; the message says what is missing and the fix."""


def parse_ldd(output: str) -> list[str]:
    """The libraries ldd could not find, in its order. A static binary or a script
    ("not a dynamic executable") needs none."""
    return _NOT_FOUND.findall(output)


def missing_library(lib: str, binary: Path | None = None) -> str:
    """One missing library, named with what to install."""
    if binary is not None and (binary.parent / lib).exists():
        return (
            f"{lib} => not found: the archive ships it beside {binary.name}, but the "
            "binary does not look there (no $ORIGIN run path); use a release built with one"
        )
    if m := _CUDA_LIB.match(lib):
        cuda = m[1]
        return (
            f"{lib} => not found: install the CUDA {cuda} runtime (NVIDIA's "
            f"cuda-cudart-{cuda}-x and libcublas-{cuda}-x packages, or libcudart{cuda} and "
            f"libcublas{cuda} from the distribution), or use the CPU build"
        )
    if lib.startswith("libcuda.so"):
        return (
            f"{lib} => not found: the NVIDIA driver's library is missing; install the "
            "NVIDIA driver (and reboot if it was just upgraded), or use the CPU build"
        )
    what = _PACKAGES.get(lib)
    if what is None:
        return (
            f"{lib} => not found: install the package that provides it "
            f"(apt-file search {lib}; dnf provides '*/{lib}')"
        )
    return f"{lib} => not found: install {what}"


async def run_ldd(binary: Path) -> str | None:
    """ldd's output for ``binary``; None when the node has no ldd."""
    try:
        done = await command.run(["ldd", str(binary)], VERSION_TIMEOUT)
    except FileNotFoundError:
        return None
    except TimeoutError:
        raise EngineCheckError(f"ldd {binary} did not finish in {VERSION_TIMEOUT:.0f}s") from None
    # ldd exits 1 for a static binary or a script; its words say so, not its status.
    return done.out


async def check_libraries(binary: Path, ldd: Ldd = run_ldd) -> None:
    """Raise EngineCheckError naming every library the binary needs and cannot find."""
    output = await ldd(binary)
    if output is None:
        return
    missing = parse_ldd(output)
    if missing:
        raise EngineCheckError("; ".join(missing_library(lib, binary) for lib in missing))


async def run_output(argv: list[str], timeout: float = VERSION_TIMEOUT) -> tuple[int, str]:
    """Exit status and output (stdout and stderr together) of a short command."""
    try:
        done = await command.run(argv, timeout)
    except TimeoutError:  # before OSError, of which it is one
        raise EngineCheckError(f"{' '.join(argv)} did not finish in {timeout:.0f}s") from None
    except OSError as exc:
        raise EngineCheckError(f"{argv[0]} cannot be run: {exc.strerror or exc}") from exc
    return done.code, done.out


async def seen_to_run(adapter: EngineAdapter, binary: str) -> tuple[str | None, str]:
    """Run the engine's version command: its version (None when it names none) and its
    output. EngineCheckError when the binary is missing, not executable, or fails."""
    if not os.path.isfile(binary):
        raise EngineCheckError(f"{binary} does not exist or is not a file")
    if not os.access(binary, os.X_OK):
        raise EngineCheckError(f"{binary} is not executable")
    argv = adapter.version_command(binary)
    code, output = await run_output(argv)
    if code != 0:
        last = [line for line in output.splitlines() if line.strip()][-3:]
        said = ": " + " | ".join(last) if last else ""
        shown = " ".join([os.path.basename(argv[0]), *argv[1:]])
        raise EngineCheckError(f"`{shown}` failed (exit {code}){said}")
    return adapter.parse_version(output), output
