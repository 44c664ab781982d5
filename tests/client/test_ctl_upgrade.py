"""``llmgw ctl upgrade``'s follower: each step said as it changes, the control plane's
own restart ridden out (out of reach, asked again), and given up on after ``away``."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_upgrade import follow, shown


def run(state: str, *steps: tuple[str, str, str], error: str | None = None) -> Any:
    return {
        "version": "9.1.0",
        "source": "https://r.example",
        "by": "admin",
        "started": 1.0,
        "ended": None,
        "state": state,
        "step": None,
        "error": error,
        "node_timeout": 300.0,
        "downgrade": False,
        "ready": {},
        "steps": [
            {
                "kind": kind,
                "target": target,
                "state": st,
                "detail": st,
                "started": None,
                "ended": None,
            }
            for kind, target, st in steps
        ],
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.now += seconds


def test_each_step_is_said_once_and_the_restart_is_ridden_out() -> None:
    answers: list[Any] = [
        run("running", ("control-plane", "cp-a", "running")),
        AdminError("cannot reach the control plane"),
        AdminError("cannot reach the control plane"),
        run("running", ("control-plane", "cp-a", "running")),
        run("running", ("control-plane", "cp-a", "done"), ("node", "a", "running")),
        run("done", ("control-plane", "cp-a", "done"), ("node", "a", "done")),
    ]

    def status() -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    said: list[str] = []
    clock = Clock()
    last = follow(status, said.append, clock, clock.pause)
    assert last["state"] == "done" and answers == []
    assert said == [
        "control-plane cp-a: running: running",
        "the control plane is starting again; waiting for it",
        "control-plane cp-a: done: done",
        "node a: running: running",
        "node a: done: done",
    ]


def test_a_control_plane_away_too_long_or_a_refusal_ends_it() -> None:
    clock = Clock()

    def away() -> Any:
        raise AdminError("cannot reach the control plane")

    with pytest.raises(AdminError, match="for 60 s, while it started again"):
        follow(away, lambda line: None, clock, clock.pause)
    assert 60 < clock.now < 63

    def refused() -> Any:
        raise AdminError("forbidden", "forbidden", 403)

    with pytest.raises(AdminError, match="forbidden"):
        follow(refused, lambda line: None, clock, clock.pause)


def test_the_status_table_names_where_it_stopped() -> None:
    text = shown(
        run(
            "failed",
            ("node", "a", "failed"),
            ("node", "b", "pending"),
            error="node a did not come back",
        )
    )
    assert "Upgrade to 9.1.0 from https://r.example (by admin): failed" in text
    assert "Stopped: node a did not come back" in text
    assert text.index(" a ") < text.index(" b ")
