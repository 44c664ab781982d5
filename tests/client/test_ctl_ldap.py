"""``llmgw ctl auth ldap [show|set|off|test]``: what each asks the admin API and what it
prints; against a stand-in client. (tests/e2e/test_ldap.py runs them against a real
control plane and slapd.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli import main
from tests.support.fakeadmin import FakeAdmin, install

OFF = {
    "enabled": False,
    "url": None,
    "bind_dn": None,
    "bind_password": None,
    "base_dn": None,
    "user_filter": None,
    "group_base": None,
    "group_filter": None,
    "ad": False,
    "ca": None,
    "maps": [],
    "updated_at": None,
    "updated_by": None,
}
SET = {
    **OFF,
    "enabled": True,
    "url": "ldaps://dir:636",
    "bind_dn": "cn=llmgw,dc=x",
    "bind_password": "set",
    "base_dn": "dc=x",
    "user_filter": "(uid={login})",
    "group_base": "dc=x",
    "group_filter": "(member={dn})",
    "ca": "set",
    "maps": [{"group": "ops", "target": "cluster", "role": "operator"}],
    "updated_at": 1.0,
    "updated_by": "admin@127.0.0.1",
}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_set_reads_the_password_and_ca_from_files_and_sends_what_was_given(
    admin: FakeAdmin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pw").write_text("s3cret pass\n")
    (tmp_path / "ca.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n"
    )
    admin.answer("POST", "/api/v1/auth/ldap", SET)
    args = ["--url", "ldaps://dir:636", "--bind-dn", "cn=llmgw,dc=x", "--base-dn", "dc=x"]
    more = ["--ca-file", str(tmp_path / "ca.pem"), "--map", "ops=cluster:operator", "--ad"]
    assert (
        main(
            [
                "ctl",
                "auth",
                "ldap",
                "set",
                *args,
                "--bind-password-file",
                str(tmp_path / "pw"),
                *more,
            ]
        )
        == 0
    )
    assert admin.asked == [
        (
            "POST",
            "/api/v1/auth/ldap",
            {
                "url": "ldaps://dir:636",
                "bind_dn": "cn=llmgw,dc=x",
                "base_dn": "dc=x",
                "ad": True,
                "maps": ["ops=cluster:operator"],
                "bind_password": "s3cret pass",
                "ca_pem": "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----",
            },
        )
    ]
    out = capsys.readouterr().out
    assert "s3cret" not in out and "bind password" in out and "ops" in out


@pytest.mark.parametrize(("content", "said"), [("", "is empty"), (None, "cannot read")])
def test_a_password_file_empty_or_missing_is_refused_before_anything_is_sent(
    admin: FakeAdmin,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    said: str,
) -> None:
    pw = tmp_path / "pw"
    if content is not None:
        pw.write_text(content)
    args = ["--url", "ldap://d", "--bind-dn", "cn=r,dc=x", "--base-dn", "dc=x"]
    assert main(["ctl", "auth", "ldap", "set", *args, "--bind-password-file", str(pw)]) == 1
    err = capsys.readouterr().err
    assert f"--bind-password-file: {'' if content is not None else 'cannot read '}{pw}" in err
    assert said in err
    assert admin.asked == []


def test_show_and_off(admin: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    admin.answer("GET", "/api/v1/auth/ldap", SET)
    admin.answer("DELETE", "/api/v1/auth/ldap", OFF)
    assert main(["ctl", "auth", "ldap"]) == 0
    shown = capsys.readouterr().out
    assert "ldaps://dir:636" in shown and "GROUP" in shown and "operator" in shown
    assert main(["ctl", "auth", "ldap", "off"]) == 0
    assert "LDAP sign-in is off" in capsys.readouterr().out


def test_test_prints_each_step_and_fails_when_one_did(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer(
        "POST",
        "/api/v1/auth/ldap/test",
        {
            "ok": False,
            "failed": "find",
            "message": "no one under dc=x matches (uid=mallory)",
            "steps": [
                {"step": "connect", "ok": True, "detail": "ldap://d"},
                {"step": "service_bind", "ok": True, "detail": "cn=r,dc=x"},
                {"step": "find", "ok": False, "detail": "no one under dc=x matches (uid=mallory)"},
            ],
            "person": None,
            "groups": [],
            "grants": [],
        },
    )
    assert main(["ctl", "auth", "ldap", "test", "mallory"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["connect", "ok"]
    assert lines[3].split()[:2] == ["find", "FAILED"]
    assert lines[-1] == "failed at find"
    assert admin.asked == [("POST", "/api/v1/auth/ldap/test", {"login": "mallory"})]
