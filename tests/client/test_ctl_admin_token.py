"""``llmgw ctl admin-token rotate``: what it asks the admin API, the new token printed
once with what it means (or the API's JSON with --json), and a refusal's words and exit
status; against a stand-in client."""

from __future__ import annotations

import json

import pytest

from llmgw.cli import main
from llmgw.client.adminbase import AdminError
from tests.support.fakeadmin import FakeAdmin, install

ROUTE = ("POST", "/api/v1/admin-token/rotate")
TOKEN = "llmgw-admin-new"


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_the_new_token_comes_first_alone_then_what_it_means(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer(*ROUTE, {"token": TOKEN, "token_file": "/var/lib/llmgw/admin.token"})
    assert main(["ctl", "admin-token", "rotate"]) == 0
    token, blank, note = capsys.readouterr().out.splitlines()
    assert (token, blank) == (TOKEN, "")
    assert "shown this once" in note and "The old one is refused" in note
    assert "written to /var/lib/llmgw/admin.token on the leader's machine" in note
    assert "Replace every other copy by hand" in note and "LLMGW_TOKEN" in note
    assert admin.asked == [("POST", ROUTE[1], {})]


def test_a_token_file_not_rewritten_is_said(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer(*ROUTE, {"token": TOKEN, "token_file": None})
    assert main(["ctl", "admin-token", "rotate"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(TOKEN + "\n\n")
    assert "admin.token could not be rewritten (its log says why)" in out
    assert "written to" not in out


def test_json_is_the_apis_answer(admin: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    answer = {"token": TOKEN, "token_file": "/d/admin.token"}
    admin.answer(*ROUTE, answer)
    assert main(["ctl", "admin-token", "rotate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == answer


def test_a_refusal_exits_1_with_the_control_planes_words(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = AdminError(f"http://cp{ROUTE[1]}: this control plane is a standby")
    admin.answer(*ROUTE, refused)
    assert main(["ctl", "admin-token", "rotate"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"llmgw: {refused}\n"
