"""The machine a benchmark ran on, in the one line each benchmark's report opens with:
its CPUs and their model, its memory, the Python that ran.

    .venv/bin/python bench/host.py
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = psutil.virtual_memory().total / 1024**3
    return f"{psutil.cpu_count()} CPUs ({model}), {mem:.1f} GiB, Python {platform.python_version()}"


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(machine())
    return 0


if __name__ == "__main__":
    sys.exit(main())
