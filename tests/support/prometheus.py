"""A real Prometheus for tests: Debian's ``/usr/bin/prometheus`` (the ``prometheus``
package, which ``make test`` installs) scraping one target every second, on 127.0.0.1
and a free port, its config and storage under a temporary folder removed when it stops.

``start_prometheus(target, ...)`` is a context manager that yields a ``Prometheus``:
``query(expr)`` asks ``/api/v1/query`` and returns the result vector, ``wait_for(expr)``
polls until that is not empty, and ``targets()`` is the scrape health of the target. The
target is ``host:port`` with ``/metrics`` served over http, or https checked against a CA
file (or not checked at all); a bearer token, when given, goes in a file Prometheus reads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import free_port

BINARY = os.environ.get("LLMGW_PROMETHEUS", "/usr/bin/prometheus")
INSTALL_HINT = (
    "run `make test`, which installs the Debian packages the tests need (prometheus, "
    "which brings /usr/bin/prometheus and /usr/bin/promtool)"
)
JOB = "llmgw"


def missing() -> str | None:
    """Why Prometheus cannot be started here, or None when it can."""
    if not os.access(BINARY, os.X_OK):
        return f"Prometheus is not installed ({BINARY} missing): {INSTALL_HINT}"
    return None


def scrape_config(
    target: str,
    *,
    scheme: str = "http",
    token_file: Path | None = None,
    ca_file: Path | None = None,
    insecure: bool = False,
    rule_files: list[Path] | None = None,
) -> dict[str, Any]:
    """prometheus.yml scraping ``target``'s /metrics every second."""
    job: dict[str, Any] = {
        "job_name": JOB,
        "scheme": scheme,
        "metrics_path": "/metrics",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "static_configs": [{"targets": [target]}],
    }
    if token_file is not None:
        job["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    if scheme == "https":
        tls: dict[str, Any] = {"insecure_skip_verify": insecure}
        if ca_file is not None:
            tls["ca_file"] = str(ca_file)
        job["tls_config"] = tls
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [job],
    }
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    return config


@dataclass
class Prometheus:
    """A running Prometheus: its URL, its folder and its process."""

    url: str
    base: Path
    process: subprocess.Popen[bytes]

    @property
    def log(self) -> str:
        """What Prometheus has written to stderr so far."""
        return (self.base / "prometheus.log").read_text(errors="replace")

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful answer of the HTTP API."""
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:
            with e:
                detail = e.read().decode(errors="replace")
            raise AssertionError(f"{url}: {e.code} {detail}") from e
        if body.get("status") != "success":
            raise AssertionError(f"{url}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now: ``[{metric, value}, ...]``."""
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr!r} is a {data['resultType']}, not a vector")
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets: ``health``, ``lastError``, ``scrapeUrl``, ..."""
        return list(self.api("/api/v1/targets", state="active")["activeTargets"])

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until its result is not empty, and return it."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        health = [
            {k: t.get(k) for k in ("scrapeUrl", "health", "lastError", "lastScrape")}
            for t in self.targets()
        ]
        raise AssertionError(
            f"{expr!r} still empty after {timeout:g}s (last answer {result}); targets: {health}"
        )


def _wait_ready(prom: Prometheus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if prom.process.poll() is not None:
            raise RuntimeError(f"prometheus exited ({prom.process.returncode}):\n{prom.log}")
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"prometheus not ready after {timeout:g}s:\n{prom.log}")


def _stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


@contextmanager
def start_prometheus(
    target: str,
    *,
    scheme: str = "http",
    token: str | None = None,
    ca_file: Path | None = None,
    insecure: bool = False,
    rule_files: list[Path] | None = None,
    ready_timeout: float = 30.0,
    extra_jobs: list[dict[str, Any]] | None = None,
) -> Iterator[Prometheus]:
    """Run Prometheus scraping ``target`` (host:port) until the block ends; ``extra_jobs``
    are more ``scrape_configs`` entries, as prometheus.yml says them (an
    ``http_sd_configs`` job)."""
    if (why := missing()) is not None:
        raise RuntimeError(why)
    if scheme not in ("http", "https"):
        raise ValueError(f"scheme must be http or https, not {scheme!r}")
    base = Path(tempfile.mkdtemp(prefix="llmgw-prometheus-"))
    try:
        token_file = None
        if token is not None:
            token_file = base / "token"
            token_file.write_text(token)
            token_file.chmod(0o600)
        config = scrape_config(
            target,
            scheme=scheme,
            token_file=token_file,
            ca_file=ca_file,
            insecure=insecure,
            rule_files=rule_files,
        )
        config["scrape_configs"] += extra_jobs or []
        (base / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        argv = [
            BINARY,
            f"--config.file={base / 'prometheus.yml'}",
            f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        with open(base / "prometheus.log", "wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=base)
        prom = Prometheus(url=f"http://127.0.0.1:{port}", base=base, process=process)
        try:
            _wait_ready(prom, ready_timeout)
            yield prom
        finally:
            _stop(process)
    finally:
        shutil.rmtree(base, ignore_errors=True)
