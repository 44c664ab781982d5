"""Network namespaces for tests that need separate machines' views of one network (the
firewall's): ``ip`` itself, a command run inside a namespace, and an HTTP probe that says
how a connection went."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """\
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    s.sendall(b"GET " + sys.argv[3].encode() + b" HTTP/1.0\\r\\n\\r\\n")
    print("answered" if s.recv(12).startswith(b"HTTP/1.") else "silent")
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(f"error {exc}")
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def inside(netns: str) -> list[str]:
    """The prefix that runs a command inside ``netns``."""
    return ["ip", "netns", "exec", netns]


def run_in(netns: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*inside(netns), *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def reach(netns: str, host: str, port: int, path: str = "/") -> str:
    """answered / refused / timeout: an HTTP GET from ``netns``, as it went."""
    done = subprocess.run(
        [*inside(netns), sys.executable, "-c", PROBE, host, str(port), path],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return done.stdout.strip() or f"probe failed: {done.stderr.strip()}"
