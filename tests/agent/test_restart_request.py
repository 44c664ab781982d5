"""``restart`` over the stream (``llmgw restart``): the agent answers yes first, then
starts again in place; it lists ``restart.v1`` so a control plane knows it may ask."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.agent.runtime import NodeRuntime, RuntimeOptions
from llmgw.agent.session import FEATURES
from llmgw.wire.messages import Message, Request, Response


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[tuple[NodeRuntime, list[str]]]:
    said: list[str] = []
    sent: list[Message] = []
    rt = NodeRuntime(
        RuntimeOptions(
            state_dir=tmp_path / "state",
            weights_dir=tmp_path / "weights",
            release_source="unused",
            measure_memory=False,
            # What the exec would be: recorded with what had been sent by then.
            restart=lambda: said.append(
                f"restart after {[m.id for m in sent if isinstance(m, Response)]}"
            ),
        )
    )
    rt.attach(sent.append)
    try:
        yield rt, said
    finally:
        await rt.close()


async def test_the_answer_goes_before_the_restart(
    runtime: tuple[NodeRuntime, list[str]],
) -> None:
    rt, said = runtime
    await rt.handle(Request(id="r1", kind="restart", args={}))
    assert said == ["restart after ['r1']"]


def test_agents_say_they_answer_restart() -> None:
    assert "restart.v1" in FEATURES
