"""A trace's requests and the ``--fail`` events: each mistake named by its line or spec."""

from __future__ import annotations

import pytest

from llmgw.sim.cards import SimError
from llmgw.sim.load import FleetEvent, check_events, parse_event, read_trace
from tests.sim.conftest import Write

MODELS = {"llama-8b", "llama-70b"}


def test_a_trace_is_read_in_time_order_and_cut_at_the_duration(write: Write) -> None:
    path = write(
        "t.jsonl",
        '{"at": 5, "model": "llama-8b", "prompt_tokens": 10, "output_tokens": 2}\n'
        "\n# a comment\n"
        '{"at": 1.5, "model": "llama-70b", "prompt_tokens": 7, "output_tokens": 3}\n'
        '{"at": 99, "model": "llama-8b", "prompt_tokens": 1, "output_tokens": 1}\n',
    )
    reqs = read_trace(path, MODELS, 60.0)
    assert [(r.at, r.model, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (1.5, "llama-70b", 7, 3),
        (5.0, "llama-8b", 10, 2),
    ]
    assert len(read_trace(path, MODELS, None)) == 3


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("{not json", "line 2: not a JSON object"),
        ("[1, 2]", "line 2: a request is a JSON object"),
        (
            '{"at": 1, "model": "llama-8b", "prompt_tokens": 1, "output_tokens": 1, "x": 1}',
            "line 2: unknown field 'x'",
        ),
        (
            '{"at": -1, "model": "llama-8b", "prompt_tokens": 1, "output_tokens": 1}',
            "line 2: at must be seconds from the start",
        ),
        (
            '{"at": 1, "model": "gpt-9", "prompt_tokens": 1, "output_tokens": 1}',
            "line 2: model 'gpt-9' is not in MODELS.yaml",
        ),
        (
            '{"at": 1, "model": "llama-8b", "prompt_tokens": 0, "output_tokens": 1}',
            "line 2: prompt_tokens must be a whole number of tokens, 1 or more",
        ),
        (
            '{"at": 1, "model": "llama-8b", "prompt_tokens": 1, "output_tokens": 2.5}',
            "line 2: output_tokens must be a whole number",
        ),
        ('{"at": 1, "model": "llama-8b", "prompt_tokens": 1}', "line 2: output_tokens"),
    ],
)
def test_a_bad_line_is_named(write: Write, line: str, said: str) -> None:
    good = '{"at": 0, "model": "llama-8b", "prompt_tokens": 1, "output_tokens": 1}'
    path = write("t.jsonl", f"{good}\n{line}\n")
    with pytest.raises(SimError) as caught:
        read_trace(path, MODELS, None)
    assert f"--load {path}: {said}" in str(caught.value)


def test_a_trace_that_is_not_text_is_refused(write: Write) -> None:
    path = write("t.jsonl", "")
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SimError, match="not text"):
        read_trace(path, MODELS, None)


def test_events_are_read_from_their_specs() -> None:
    assert parse_event("node=gpu17@10m") == FleetEvent("node", "gpu17", 600.0)
    assert parse_event("drain=gpu3@90s") == FleetEvent("drain", "gpu3", 90.0)
    assert parse_event("node=cpu-a@1h").at == 3600.0


@pytest.mark.parametrize(
    "spec", ["gpu17@10m", "reboot=gpu17@10m", "node=@10m", "node=gpu17", "node=gpu17@soon"]
)
def test_a_bad_fail_spec_says_the_form(spec: str) -> None:
    with pytest.raises(SimError) as caught:
        parse_event(spec)
    said = str(caught.value)
    assert said.startswith(f"--fail {spec!r}: ")
    if "@soon" not in spec:
        assert "node=NAME@WHEN" in said and "drain=NAME@WHEN" in said
    else:
        assert "not a duration" in said


def test_an_event_on_a_node_not_in_the_fleet_is_refused() -> None:
    check_events([FleetEvent("node", "gpu1", 1.0)], {"gpu1", "gpu2"})
    with pytest.raises(SimError, match="no node 'gpu9' in the fleet"):
        check_events([FleetEvent("drain", "gpu9", 1.0)], {"gpu1", "gpu2"})
