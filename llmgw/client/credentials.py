"""Where ``llmgw login`` keeps the control plane and the personal token ctl uses.

One small JSON file, ``{"server": URL, "token": TOKEN}``, readable by its owner alone:
``$LLMGW_CTL_CONFIG``, else ``$XDG_CONFIG_HOME/llmgw/ctl.json``, else
``~/.config/llmgw/ctl.json``. ctl reads it after ``--server/--token`` and
``LLMGW_SERVER/LLMGW_TOKEN``, and before the data dir's admin token, which stays for
bootstrap and recovery on the control plane's machine.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Saved:
    server: str
    token: str


def path() -> Path:
    env = os.environ.get("LLMGW_CTL_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw" / "ctl.json"


def base_url(server: str) -> str:
    """A server as ctl calls it: with its scheme (http:// when left out), no last /."""
    server = server.strip()
    if "://" not in server:
        server = f"http://{server}"
    return server.rstrip("/")


def read() -> Saved | None:
    """What ``llmgw login`` kept; None when it kept nothing (or the file is not its)."""
    where = path()
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    server, token = data.get("server"), data.get("token")
    if not isinstance(server, str) or not isinstance(token, str) or not server or not token:
        return None
    return Saved(base_url(server), token)


def write(saved: Saved) -> Path:
    """Keep ``saved``, readable by its owner alone, replacing what was there at once."""
    where = path()
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = json.dumps({"server": saved.server, "token": saved.token}, indent=2) + "\n"
    fd, temp = tempfile.mkstemp(prefix=".ctl-", dir=where.parent)  # made 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(temp, where)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return where
