"""``llmgw version [--cluster] [--json]``: this llmgw's version without asking anyone,
and with --cluster every control plane and agent as the admin API says them, versions
that differ named; against a stand-in client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw import __version__
from llmgw.cli import main
from llmgw.client.adminbase import AdminError
from tests.support.fakeadmin import FakeAdmin, install

VERSIONS: dict[str, Any] = {
    "version": "0.2.0",
    "servers": [
        {"name": "cp1", "role": "leader", "version": "0.2.0", "answers": True, "this": True},
        {"name": "cp2", "role": "standby", "version": "0.1.0", "answers": True, "this": False},
        {"name": "cp3", "role": None, "version": None, "answers": False, "this": False},
    ],
    "nodes": [
        {"id": "gpu01", "version": "0.2.0", "connected": True},
        {"id": "gpu02", "version": "0.1.0", "connected": True},
        {"id": "gpu03", "version": None, "connected": False},
    ],
}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_alone_it_says_this_llmgws_version_and_asks_nobody(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"llmgw {__version__}\n"
    assert main(["version", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"version": __version__}
    assert admin.asked == []


def test_the_cluster_each_process_and_the_versions_that_differ(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/versions", VERSIONS)
    assert main(["version", "--cluster"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["CONTROL", "PLANE", "ROLE", "VERSION", "ANSWERS"]
    assert out[1].split() == ["cp1", "*", "leader", "0.2.0", "yes"]
    assert out[2].split() == ["cp2", "standby", "0.1.0", "yes"]
    assert out[3].split() == ["cp3", "not", "answering", "-", "no"]
    assert out[5].split() == ["NODE", "VERSION", "CONNECTED"]
    assert out[6].split() == ["gpu01", "0.2.0", "yes"]
    assert out[8].split() == ["gpu03", "-", "no"]
    assert out[-1] == "2 versions run: 0.1.0: cp2, gpu02; 0.2.0: cp1, gpu01"

    assert main(["version", "--cluster", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == VERSIONS
    assert admin.asked == [("GET", "/api/v1/versions", None)] * 2


def test_one_version_everywhere_is_said_as_no_difference(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    same = {
        "version": "0.2.0",
        "servers": [VERSIONS["servers"][0]],
        "nodes": [],
    }
    admin.answer("GET", "/api/v1/versions", same)
    assert main(["version", "--cluster"]) == 0
    out = capsys.readouterr().out
    assert "No nodes yet." in out and "versions run" not in out


def test_a_control_plane_out_of_reach_is_said_and_fails(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("GET", "/api/v1/versions", AdminError("cannot reach http://cp: refused"))
    assert main(["version", "--cluster"]) == 1
    assert "cannot reach http://cp" in capsys.readouterr().err
