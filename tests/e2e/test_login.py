"""``llmgw login`` end to end: a control plane as a real process, ``llmgw login --server``
as another; the person approves its code on the ``/admin/device`` page with their
session (a browser's HTTP, cookie and CSRF token), ``login`` writes the token it is
answered into the user's ctl config, and ``llmgw ctl people list`` then works with it
alone, acting as that person."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.server.datadir import DataDir
from llmgw.server.sessions import COOKIE, Sessions
from tests.e2e.cluster import LLMGW, Cluster, run
from tests.support.procs import stop_process

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cp = Cluster(tmp_path / "cp")
    cp.init()
    cp.start_server()
    try:
        yield cp
    finally:
        cp.stop()


def test_login_approved_on_the_page_leaves_a_token_ctl_uses(
    cluster: Cluster, tmp_path: Path
) -> None:
    base = f"http://{cluster.listen}"
    ann = cluster.api("/api/v1/people", body={"login": "ann", "name": "Ann"})
    cluster.api("/api/v1/people", body={"login": "bob"})
    config = tmp_path / "home" / "ctl.json"
    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_SERVER", "LLMGW_TOKEN")}
    env |= {"LLMGW_CTL_CONFIG": str(config), "LLMGW_DATA_DIR": str(tmp_path / "none")}

    login = subprocess.Popen(
        [*LLMGW, "login", "--server", cluster.listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert login.stdout is not None
        said = [login.stdout.readline(), login.stdout.readline()]
        link = re.search(r"^Open (\S+)$", said[0].strip())
        code = re.search(r"approve the code (\S+) if it shows", said[1])
        assert link and code, said
        assert link[1] == f"{base}/admin/device?code={code[1]}"

        # Ann, signed in to the pages (a session as her identity provider's sign-in opens).
        secret = DataDir(cluster.data_dir).cluster_secret()
        cookie = Sessions(secret, list).open_person("ann", ann["id"])
        with httpx.Client(cookies={COOKIE: cookie}, headers={"origin": base}) as browser:
            page = browser.get(link[1])
            assert page.status_code == 200 and code[1] in page.text
            form = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', page.text))
            done = browser.post(f"{base}/admin/device", data={**form, "decision": "approve"})
            assert done.status_code == 200 and "go back to your terminal" in done.text

        out, _ = login.communicate(timeout=30)
        assert login.returncode == 0, out
        assert f"Signed in to {base} as ann (no cluster role; 0 memberships)" in out
    finally:
        stop_process(login)
        if login.stdout is not None:
            login.stdout.close()

    kept = json.loads(config.read_text())
    assert kept["server"] == base and kept["token"].startswith("llmgw-pat-")
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    # ctl with the kept token alone: it acts as Ann, who sees herself and nobody else.
    listed = json.loads(run("ctl", "people", "list", "--json", env=env).stdout)
    assert [p["login"] for p in listed] == ["ann"]
    assert cluster.api("/api/v1/me", token=kept["token"])["name"] == "ann"
    # Her token, named for where it was made, in her list.
    tokens = json.loads(run("ctl", "tokens", "list", "--json", env=env).stdout)
    assert [t["name"][:24] for t in tokens] == ["llmgw login: llmgw ctl o"]
