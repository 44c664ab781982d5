"""A fake of an agent's stream as the control plane holds it (``fleet.nodeview.Session``):
it records every message sent and every request asked, and answers ``ask()`` from what
the test gave it for that kind of request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from llmgw.wire.messages import Message, Response

# What a request is answered with: responses in order, where an exception is raised
# in its turn (a timeout, a dropped connection).
Answers = list[Response | BaseException]
Answerer = Callable[[dict[str, Any]], Answers]


def ok(result: Any, more: bool = False) -> Response:
    return Response(id="r", result=result, more=more)


def failed(error: str) -> Response:
    return Response(id="r", ok=False, error=error)


class FakeSession:
    def __init__(self, **answers: Answerer | Answers) -> None:
        """``answers`` by request kind with ``.`` written ``_`` (``weights_list``):
        a list, or a function of the request's arguments that gives one. A kind not
        given is answered with a failure, as an agent answers a request it lacks."""
        self.answers: dict[str, Answerer | Answers] = {
            kind.replace("_", "."): a for kind, a in answers.items()
        }
        self.sent: list[Message] = []
        self.asked: list[tuple[str, dict[str, Any], float]] = []
        self.closed: str | None = None

    def answer(self, kind: str, answers: Answerer | Answers) -> None:
        self.answers[kind] = answers

    def close(self, reason: str) -> None:
        self.closed = reason

    async def send(self, msg: Message) -> None:
        self.sent.append(msg)

    async def ask(
        self, kind: str, args: dict[str, Any], timeout: float = 15.0
    ) -> AsyncIterator[Response]:
        self.asked.append((kind, dict(args), timeout))
        given = self.answers.get(kind)
        if given is None:
            answers: Answers = [failed(f"this agent does not answer {kind!r}")]
        elif callable(given):
            answers = given(args)
        else:
            answers = given
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            yield answer

    def kinds(self) -> list[str]:
        """The kinds of request asked, in order."""
        return [kind for kind, _, _ in self.asked]
