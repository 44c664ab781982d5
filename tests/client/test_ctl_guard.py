"""``llmgw ctl guard``: what each command asks the admin API and what it prints;
against a stand-in client."""

from __future__ import annotations

import json

import pytest

from llmgw.cli import main
from llmgw.client.admin import JUDGE_CHECK_WAIT
from tests.support.fakeadmin import FakeAdmin, install

POLICY = {
    "name": "pii",
    "judge": "guard-1b",
    "injection": "block",
    "pii": "redact",
    "wait_ms": 2000,
    "fail": "closed",
    "warnings": ["the judge's profile default keeps llama.cpp's prompt cache: ..."],
}
CHECK = {
    "policy": "pii",
    "judge": "guard-1b",
    "wait_ms": 2000,
    "state": "slow",
    "single_ms": [2400.0, 2350.5, 2390.0],
    "burst": 8,
    "burst_p50_ms": 9000.0,
    "per_second": 0.8,
    "answered": 11,
    "advice": "give the judge a bigger machine or more replicas, or a longer --wait",
}


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    return install(monkeypatch)


def test_policy_add_sends_every_field_given(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("POST", "/api/v1/guard/policies", POLICY)
    argv = ["ctl", "guard", "policy", "add", "pii", "--judge", "guard-1b", "--pii", "block"]
    assert main([*argv, "--wait", "500", "--fail", "open"]) == 0
    assert admin.asked == [
        (
            "POST",
            "/api/v1/guard/policies",
            {
                "name": "pii",
                "judge": "guard-1b",
                "injection": "block",
                "pii": "block",
                "wait_ms": 500,
                "fail": "open",
            },
        )
    ]
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["POLICY", "JUDGE", "INJECTION", "PII", "WAIT", "FAIL"]
    assert "pii: the judge's profile default keeps" in out


def test_policy_list_show_and_remove(admin: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    admin.answer("GET", "/api/v1/guard/policies", [POLICY])
    assert main(["ctl", "guard", "policy", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [POLICY]
    admin.answer("GET", "/api/v1/guard/policies/pii", POLICY)
    assert main(["ctl", "guard", "policy", "show", "pii"]) == 0
    assert "guard-1b" in capsys.readouterr().out
    admin.answer("DELETE", "/api/v1/guard/policies/pii", POLICY)
    assert main(["ctl", "guard", "policy", "remove", "pii"]) == 0
    assert capsys.readouterr().out.strip() == "guard policy pii removed"


def test_decisions_asks_for_one_policy(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    decision = {
        "at": 1.7e9,
        "policy": "pii",
        "verdict": "redact",
        "key": "ci",
        "where": "prompt",
        "found": "email at 5-20 (redacted: a***@***)",
    }
    admin.answer("GET", "/api/v1/guard/decisions?policy=pii", [decision])
    assert main(["ctl", "guard", "decisions", "--policy", "pii"]) == 0
    out = capsys.readouterr().out
    assert "redact" in out and "a***@***" in out


def test_judge_check_says_what_to_do_and_fails_when_slow(
    admin: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    admin.answer("POST", "/api/v1/guard/judges/check", [CHECK])
    assert main(["ctl", "guard", "judge", "check", "pii"]) == 1
    assert admin.asked[-1] == ("POST", "/api/v1/guard/judges/check", {"policy": "pii"})
    # Eleven judgments take longer than a call's usual 10 s: waited for far longer.
    assert admin.timeouts[-1] == JUDGE_CHECK_WAIT
    out = capsys.readouterr().out
    assert "pii (guard-1b, wait 2000 ms): SLOW" in out
    assert "about 0.8 judgments a second" in out and "a longer --wait" in out
    admin.answer("POST", "/api/v1/guard/judges/check", [{**CHECK, "state": "ok"}])
    assert main(["ctl", "guard", "judge", "check"]) == 0
    assert admin.asked[-1] == ("POST", "/api/v1/guard/judges/check", {})
