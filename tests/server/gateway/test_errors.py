"""The gateway's refusals in OpenAI's error shape: a plain failure, a service's
``Refusal`` (its status choosing the error type, its ``retry_after`` the Retry-After
header), a bad request, and an error once a stream has begun (an event, then the end)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from aiohttp import web

from llmgw.server.gateway.errors import bad_request, fail, refused, stream_error
from llmgw.server.refusal import Refusal


def body(answer: web.Response) -> Any:
    assert answer.body is not None and answer.content_type == "application/json"
    return json.loads(cast(bytes, answer.body))


def test_a_failure_is_openais_error_object() -> None:
    answer = fail(404, "no such model", "invalid_request_error", "model_not_found", "model")
    assert answer.status == 404
    assert body(answer) == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    # param and code are present, as null, when there are none.
    assert body(fail(500, "boom", "api_error"))["error"] == {
        "message": "boom",
        "type": "api_error",
        "param": None,
        "code": None,
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, "rate_limit_error"),
        (503, "service_unavailable"),
        (400, "invalid_request_error"),
        (404, "invalid_request_error"),
        (409, "invalid_request_error"),
    ],
)
def test_a_refusals_status_chooses_the_error_type(status: int, kind: str) -> None:
    answer = refused(Refusal(status, "some_code", "why, in words", "messages"))
    assert answer.status == status and "Retry-After" not in answer.headers
    assert body(answer)["error"] == {
        "message": "why, in words",
        "type": kind,
        "param": "messages",
        "code": "some_code",
    }


def test_a_refusals_retry_after_is_the_header_not_the_body() -> None:
    answer = refused(Refusal(429, "queue_full", "the queue is full", retry_after=7))
    assert answer.headers["Retry-After"] == "7"
    assert "retry_after" not in body(answer)["error"]
    zero = refused(Refusal(503, "starting", "the model is starting", retry_after=0))
    assert zero.headers["Retry-After"] == "0"


def test_a_bad_request_is_a_400_of_invalid_request_error() -> None:
    answer = bad_request("max_tokens must be positive", "invalid_value", "max_tokens")
    assert answer.status == 400
    assert body(answer)["error"] == {
        "message": "max_tokens must be positive",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "invalid_value",
    }


class Stream:
    """What a begun stream is written: its chunks, and whether it ended."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.ended = False

    async def write(self, data: bytes) -> None:
        assert not self.ended
        self.chunks.append(data)

    async def write_eof(self, data: bytes = b"") -> None:
        self.ended = True


async def test_an_error_in_a_stream_is_one_event_then_the_end() -> None:
    stream = Stream()
    await stream_error(cast(web.StreamResponse, stream), "the engine went away", "upstream_error")
    assert stream.ended
    (event,) = stream.chunks
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: ") :]) == {
        "error": {
            "message": "the engine went away",
            "type": "api_error",
            "param": None,
            "code": "upstream_error",
        }
    }
