"""The admin API's client as a ``ctl`` command uses it, without a control plane: every
call kept, each answered from a table the test fills, an exception raised in its turn
(an ``AdminError``, as the client raises for a refusal or an unreachable server).

``install`` puts it where ``llmgw.cli.main`` finds its client, so a test drives a
command exactly as a person types it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llmgw.client.admin import AdminClient


class FakeAdmin(AdminClient):
    def __init__(self) -> None:
        super().__init__("http://cp", "t")
        self.answers: dict[tuple[str, str], Any] = {}
        self.asked: list[tuple[str, str, Any]] = []
        # The wait each call asked for, where it asked for its own (None: the client's).
        self.timeouts: list[float | None] = []

    def answer(self, method: str, path: str, answer: Any) -> None:
        self.answers[(method, path)] = answer

    def request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> Any:
        self.asked.append((method, path, body))
        self.timeouts.append(timeout)
        answer = self.answers[(method, path)]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def stream(self, path: str) -> Iterator[object]:
        self.asked.append(("STREAM", path, None))
        yield from self.answers[("STREAM", path)]


def install(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    """A fake every command of this test is handed, whatever --server it was given."""
    admin = FakeAdmin()
    monkeypatch.setattr("llmgw.client.admin.resolve", lambda *given: admin)
    return admin
