"""A small client of the admin API for ``ctl``, ``node token`` and ``node add``.

It finds the control plane the way an operator expects: ``--server/--token`` first, then
``LLMGW_SERVER``/``LLMGW_TOKEN``, then, on the control plane machine, the data dir.
Synchronous and stdlib-only on purpose: a command line makes one call and exits.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.config import (
    ConfigError,
    ServerConfig,
    default_data_dir,
    format_hostport,
    load,
    parse_hostport,
)


class AdminError(RuntimeError):
    """The admin API could not be reached or refused; the message says why."""


@dataclass(frozen=True)
class AdminClient:
    base_url: str
    token: str
    timeout: float = 10.0

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"authorization": f"Bearer {self.token}", "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {exc.code}"
            raise AdminError(f"{self.base_url}{path}: {message}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(
                f"cannot reach the control plane at {self.base_url}: {reason}; is "
                "`llmgw server run` running there?"
            ) from exc

    def stream(self, path: str) -> Iterator[Any]:
        """Newline-delimited JSON from a GET, one value at a time, as it arrives."""
        req = urllib.request.Request(
            self.base_url + path, headers={"authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=None) as resp:
                for line in resp:
                    if line.strip():
                        yield json.loads(line)
        except urllib.error.HTTPError as exc:
            raise AdminError(f"{self.base_url}{path}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(f"lost the control plane at {self.base_url}: {exc}") from exc

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)


def local_url(listen: str) -> str:
    """The URL a client on this machine uses for a listener bound to ``listen``."""
    host, port = parse_hostport(listen)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{format_hostport(host, port)}"


def resolve(server: str | None, token: str | None, data_dir: Path | None) -> AdminClient:
    server = server or os.environ.get("LLMGW_SERVER")
    token = token or os.environ.get("LLMGW_TOKEN")
    root = data_dir or default_data_dir()
    if not server or not token:
        config_path = root / "server.yaml"
        token_path = root / "admin.token"
        if not config_path.exists() or not token_path.exists():
            raise AdminError(
                "no control plane to talk to: pass --server HOST:PORT and --token TOKEN, set "
                f"LLMGW_SERVER and LLMGW_TOKEN, or run on the control plane machine "
                f"(looked in data dir {root}; --data-dir or LLMGW_DATA_DIR to change it)"
            )
        try:
            config = load(ServerConfig, config_path)
        except ConfigError as exc:
            raise AdminError(str(exc)) from exc
        server = server or local_url(config.admin_listen or config.listen)
        try:
            token = token or token_path.read_text().strip()
        except PermissionError as exc:
            raise AdminError(f"cannot read {token_path}: run as its owner (or root)") from exc
    if "://" not in server:
        server = f"http://{server}"
    return AdminClient(server.rstrip("/"), token)
