"""``llmgw restart``'s side: it follows the run the control plane reports, waits for that
control plane to answer with a later start, and says what restarted (a stand-in admin
client; the real run is tests/e2e/test_cluster_restart.py)."""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Any

import pytest

from llmgw.cliargs import UsageError
from llmgw.client.adminbase import AdminError
from llmgw.client.restart import restart
from llmgw.wire.admin import RestartJson

ASKED = 1000.0


def doc(stage: str, agent: str, standby: str, error: str | None = None) -> RestartJson:
    return {
        "stage": stage,  # type: ignore[typeddict-item]
        "asked_at": ASKED,
        "by": "admin",
        "this": "cp-a",
        "agents": [
            {
                "node": "gpu01",
                "state": agent,  # type: ignore[typeddict-item]
                "reason": None,
                "version": "0.4.0",
                "engines": {"r1": 48211},
                "engines_kept": True if agent == "back" else None,
            },
            {
                "node": "old",
                "state": "skipped",
                "reason": "its agent (0.3.0) does not answer restart",
                "version": "0.3.0",
                "engines": {},
                "engines_kept": None,
            },
        ],
        "control_planes": [
            {"name": "cp-b", "role": "standby", "state": standby, "reason": None, "started": None},  # type: ignore[typeddict-item]
            {"name": "cp-a", "role": "leader", "state": "waiting", "reason": None, "started": None},
        ],
        "error": error,
    }


class Api:
    """The control plane as the command sees it: the run's states in turn, then its
    status: once more from before it started again, then with a later start."""

    base_url = "http://cp:8080"

    def __init__(self, states: list[RestartJson | AdminError]) -> None:
        self.states = states
        self.asked_status = 0

    def restart(self) -> RestartJson:
        return doc("agents", "waiting", "waiting")

    def restart_status(self) -> RestartJson:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(state, AdminError):
            raise state
        return copy.deepcopy(state)

    def status(self) -> dict[str, Any]:
        self.asked_status += 1
        uptime = 1.0 if self.asked_status > 1 else time.time() - ASKED + 50
        return {"uptime_seconds": uptime}


def ran(api: Api, *, as_json: bool = False) -> int:
    args = argparse.Namespace(json=as_json, timeout=10.0)
    return restart(args, lambda _: api)  # type: ignore[arg-type,return-value]


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmgw.client.restart.POLL", 0.01)


def test_it_says_each_process_as_it_comes_back(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api(
        [
            doc("agents", "asked", "waiting"),
            doc("control_planes", "back", "asked"),
            doc("this", "back", "back"),
        ]
    )
    assert ran(api) == 0
    assert api.asked_status == 2
    assert capsys.readouterr().out.splitlines() == [
        "restarting 1 agent(s): gpu01",
        "skipped: old (its agent (0.3.0) does not answer restart)",
        "then control planes: cp-b, cp-a (cp-a last)",
        "agent gpu01: back on 0.4.0, engines kept serving (pids 48211 unchanged)",
        "control plane cp-b (standby): back",
        "control plane cp-a (leader, this one): back",
        "restarted 1 agent(s) and 2 control plane(s); every engine kept serving",
    ]


def test_a_control_plane_gone_mid_run_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api([doc("control_planes", "back", "back"), AdminError("cannot reach it")])
    assert ran(api, as_json=True) == 0
    assert api.asked_status == 2
    done = json.loads(capsys.readouterr().out)
    assert done["stage"] == "done"
    assert [(p["name"], p["state"]) for p in done["control_planes"]] == [
        ("cp-b", "back"),
        ("cp-a", "back"),
    ]
    assert done["control_planes"][1]["started"] > ASKED


def test_a_run_that_stopped_says_where(capsys: pytest.CaptureFixture[str]) -> None:
    api = Api([doc("failed", "failed", "waiting", error="gpu01: did not come back")])
    with pytest.raises(UsageError, match="the restart stopped: gpu01: did not come back"):
        ran(api)
    assert "agent gpu01: failed" in capsys.readouterr().out
