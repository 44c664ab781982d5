"""A real OpenID Connect provider for the tests: the npm package ``oidc-provider`` (pinned
below) run by Debian's ``nodejs`` with ``oidcprovider.mjs`` beside this file, which
configures its one client (``llmgw``) and two people with groups (alice, bob).

The package is installed by npm once per version into ``~/.cache/llmgw/npm/`` (outside
the clone; a lock keeps two workers from installing it at once, and an install that is
there is used as it is). ``started`` runs the provider on a free port of loopback and
stops it on exit; the tests change a person's groups and the provider's clock through
its ``/test/`` routes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from tests.support.procs import stop_process

VERSION = "9.13.3"
HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "oidcprovider.mjs"
CLIENT_ID = "llmgw"
PEOPLE = {"alice": "alice-pw", "bob": "bob-pw"}


def cache_dir() -> Path:
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("LLMGW_CACHE") or xdg / "llmgw") / "npm"


def installed() -> Path:
    """oidc-provider's entry module, installed by npm when it is not there yet."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError(
            "node and npm not found: the OIDC tests run Debian's nodejs and npm, which "
            "`make apt` installs (or: apt-get install --no-install-recommends nodejs npm)"
        )
    root = cache_dir() / f"oidc-provider-{VERSION}"
    entry = root / "node_modules" / "oidc-provider" / "lib" / "index.js"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.parent / f"oidc-provider-{VERSION}.lock")):
        if not entry.is_file():
            (root / "package.json").write_text('{"name": "llmgw-test-idp", "private": true}\n')
            out = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts",
                 f"oidc-provider@{VERSION}"],
                cwd=root, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            if out.returncode != 0 or not entry.is_file():
                raise RuntimeError(f"npm install oidc-provider@{VERSION} failed:\n{out.stderr}")
    return entry


@dataclass
class Provider:
    base: str
    client_secret: str
    log: Path

    @property
    def liar(self) -> str:
        """An issuer whose discovery document points at this provider: its ID tokens
        come from another issuer than the one it names."""
        return f"{self.base}/liar"

    def _post(self, path: str, body: dict[str, object]) -> object:
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def set_groups(self, login: str, groups: list[str]) -> None:
        assert self._post("/test/groups", {"login": login, "groups": groups}) == groups

    def skew(self, seconds: float) -> None:
        """The provider's clock ``seconds`` off from now on (0: right again)."""
        self._post("/test/skew", {"seconds": seconds})


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def started(root: Path, port: int, client_secret: str) -> Iterator[Provider]:
    entry = installed()
    log = root / "oidc-provider.log"
    env = {**os.environ, "OIDC_CLIENT_SECRET": client_secret}
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["node", str(SCRIPT), str(entry), str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    provider = Provider(f"http://127.0.0.1:{port}", client_secret, log)
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"{provider.base}/.well-known/openid-configuration"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"oidc-provider did not start:\n{log.read_text()}")
            time.sleep(0.1)
        yield provider
    finally:
        stop_process(proc)
