"""``llmgw login`` against a real control plane's admin API and pages over HTTP
(``tests/support/adminserver.py``): a token pasted on stdin, or a code approved on the
``/admin/device`` page by the person signed in there (a form with its CSRF token); the
token kept, readable by its owner alone, and read by every ctl command after it."""

from __future__ import annotations

import io
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.cli import main
from llmgw.client import credentials
from llmgw.client.ctl_login import device_flow
from llmgw.server.sessions import COOKIE
from tests.support.adminserver import Served, serving


@pytest.fixture
def cp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv("LLMGW_CTL_CONFIG", str(tmp_path / "home" / "ctl.json"))
    # Nothing else to fall back on: no server, token or data dir of the environment's.
    for name in ("LLMGW_SERVER", "LLMGW_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLMGW_DATA_DIR", str(tmp_path / "no-data-dir"))
    with serving(tmp_path / "data") as served:
        yield served


def login(argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    return main(["login", *argv])


def test_a_pasted_token_is_checked_kept_and_used(
    cp: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = cp.person("ann", "viewer")
    assert (
        login(["--server", cp.base.removeprefix("http://"), "--token"], token + "\n", monkeypatch)
        == 0
    )
    out = capsys.readouterr().out
    kept = credentials.path()
    assert out.strip() == (
        f"Signed in to {cp.base} as ann (viewer; 0 memberships); the token is kept in {kept}."
    )
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert credentials.read() == credentials.Saved(cp.base, token)
    # Every ctl command reads it: no --server, no --token.
    assert main(["ctl", "people", "list", "--json"]) == 0
    assert "ann" in capsys.readouterr().out
    # A token of its own wins over it, and is refused in the control plane's words.
    assert main(["ctl", "people", "list", "--token", "llmgw-pat-wrong"]) == 1
    assert "missing or wrong token" in capsys.readouterr().err
    # Signing in to the same server again needs no --server.
    assert login(["--token"], token, monkeypatch) == 0


def test_only_a_persons_token_is_kept(
    cp: Served, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ["--server", cp.base, "--token"]
    assert login(server, cp.token, monkeypatch) == 1
    assert "that is not a personal token (they start with llmgw-pat-)" in capsys.readouterr().err
    assert login(server, "\n", monkeypatch) == 1
    assert "no token on stdin" in capsys.readouterr().err
    assert login(server, "llmgw-pat-made-up", monkeypatch) == 1
    assert "missing or wrong token" in capsys.readouterr().err
    assert not credentials.path().exists()
    assert login(["--token"], cp.person("ann"), monkeypatch) == 1
    assert "which control plane?" in capsys.readouterr().err


def page_form(page: httpx.Response) -> dict[str, str]:
    """The approve form's hidden fields."""
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page.text))


def test_a_code_approved_on_the_page_signs_ctl_in(
    cp: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    cp.person("ann")
    ann = cp.cp.directory.by_login("ann")
    assert ann is not None
    cookie = cp.cp.sessions.open_person("ann", ann.id)
    pages = httpx.Client(base_url=cp.base, cookies={COOKIE: cookie}, headers={"origin": cp.base})
    said: list[str] = []
    approved: list[str] = []

    def person_approves(seconds: float) -> None:
        """While ctl waits: Ann opens the link it printed, and approves the code."""
        assert seconds == 2
        if approved:
            return
        link = next(line.split()[1] for line in said if line.startswith("Open "))
        code = re.search(r"the code (\S+) if it shows", said[1])
        assert code is not None and link.endswith(f"/admin/device?code={code[1]}")
        page = pages.get(link)
        assert page.status_code == 200 and code[1] in page.text
        assert "llmgw ctl on " in page.text
        form = page_form(page)
        # Without the page's CSRF token, nothing is approved.
        stale = pages.post("/admin/device", data={"code": form["code"], "decision": "approve"})
        assert stale.status_code == 403 and "form token is missing or old" in stale.text
        done = pages.post("/admin/device", data={**form, "decision": "approve"})
        assert done.status_code == 200 and "go back to your terminal" in done.text
        approved.append(code[1])

    with pages:
        token = device_flow(cp.base, said.append, person_approves)
        assert approved and token.startswith("llmgw-pat-")
        acting = cp.cp.directory.by_token(token)
        assert acting is not None and acting.name == "ann"
        # The code is single-use: the page no longer knows it.
        again = pages.get(f"/admin/device?code={approved[0]}")
        assert again.status_code == 404 and "run `llmgw login` again" in again.text


def test_the_page_is_for_people_signed_in_and_a_denied_code_gives_nothing(
    cp: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    cp.person("bob")
    bob = cp.cp.directory.by_login("bob")
    assert bob is not None
    code = cp.cp.device_logins.start("ctl", "10.0.0.9")
    with httpx.Client(base_url=cp.base) as anonymous:
        answer = anonymous.get(f"/admin/device?code={code.user_code}")
        assert answer.status_code == 303 and answer.headers["location"].startswith(
            "/admin/login?next=/admin/device"
        )
    cookie = cp.cp.sessions.open_person("bob", bob.id)
    with httpx.Client(base_url=cp.base, cookies={COOKIE: cookie}) as pages:
        form = page_form(pages.get(f"/admin/device?code={code.user_code}"))
        denied = pages.post("/admin/device", data={**form, "decision": "deny"})
        assert denied.status_code == 200 and "that ctl was not signed in" in denied.text

    with httpx.Client(base_url=cp.base) as api:
        answer = api.post("/api/v1/login/device/token", json={"device_code": code.device_code})
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "access_denied"
    # His own token, made by the test, and no other.
    assert [t.name for t in cp.cp.directory.tokens_of(bob.id)] == ["test"]
