"""The pairs file is judged before anything is sent, and a refusal names the line."""

from __future__ import annotations

import json

import pytest

from llmgw.server.finetune import pairs
from llmgw.server.refusal import Refusal


def lines(*items: object) -> bytes:
    return "".join(json.dumps(i) + "\n" for i in items).encode()


def refused(data: bytes) -> str:
    with pytest.raises(Refusal) as caught:
        pairs.check(data)
    assert caught.value.status == 400 and caught.value.field == "data"
    return caught.value.message


def test_prompt_completion_and_chat_forms_are_counted() -> None:
    data = (
        lines(
            {"prompt": "2+2?", "completion": "4"},
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ]
            },
        )
        + b"\n   \n"
    )
    got = pairs.check(data)
    assert got.count == 2
    assert len(got.sha256) == 64 and got.data == data


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (lines({"prompt": "a", "completion": "b"}) + b"{not json\n", "line 2: not JSON"),
        (lines({"prompt": "a", "completion": "b"}, [1, 2]), "line 2: a JSON list, not an object"),
        (lines({"prompt": "a"}), "line 1: 'completion' is missing"),
        (lines({"prompt": 3, "completion": "b"}), "line 1: 'prompt' is a int, not text"),
        (lines({"prompt": "a", "completion": "  "}), "line 1: 'completion' is empty"),
        (lines({"prompt": "a", "completion": "b"}) * 2 + lines({"messages": []}), "line 3"),
        (lines({"messages": [{"role": "user", "content": "x"}]}), "line 1: no assistant"),
        (lines({"messages": [{"role": "robot", "content": "x"}]}), "line 1: message 1 has role"),
        (b'{"prompt": "a", "completion": "\xff"}\n', "line 1: not UTF-8"),
    ],
)
def test_a_bad_line_is_named(data: bytes, said: str) -> None:
    assert said in refused(data)


def test_empty_and_blank_files_are_refused() -> None:
    assert "holds no pairs" in refused(b"")
    assert "holds no pairs" in refused(b"\n\n  \n")


def test_caps_on_size_and_lines() -> None:
    one = lines({"prompt": "a", "completion": "b"})
    assert "at most 100,000 are taken" in refused(one * (pairs.MAX_LINES + 1))
    big = b'{"prompt": "' + b"x" * pairs.MAX_BYTES + b'", "completion": "b"}\n'
    assert "32 MiB" in refused(big)
