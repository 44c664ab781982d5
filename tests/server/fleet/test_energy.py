"""Energy per token: card energy rises given to the replicas on the card, over the tokens
they answered."""

from __future__ import annotations

import pytest

from llmgw.client.ctl_keys import usage_table
from llmgw.server.fleet.energy import EnergyMeter
from llmgw.wire.hardware import GPU


def beat(
    meter: EnergyMeter, energies: dict[str, float | None], shards: dict[str, list[str]]
) -> None:
    cards = [
        GPU(index=i, uuid=u, name="H100", energy=e) for i, (u, e) in enumerate(energies.items())
    ]
    meter.heartbeat(cards, list(shards.items()))


def test_rises_go_to_the_replicas_on_each_card() -> None:
    meter = EnergyMeter()
    shards = {"r1": ["GPU-a"], "r2": ["GPU-b", "GPU-c"], "r3": ["GPU-c"]}
    beat(meter, {"GPU-a": 1000.0, "GPU-b": 50.0, "GPU-c": 10.0}, shards)
    assert meter.joules == {}  # one reading is a baseline, not a rise
    beat(meter, {"GPU-a": 1300.0, "GPU-b": 150.0, "GPU-c": 70.0}, shards)
    # r2 has card b alone (100 J) and half of card c (60 J shared with r3).
    assert meter.joules == pytest.approx({"r1": 300.0, "r2": 130.0, "r3": 30.0})
    per_token = meter.joules_per_token({("m", "r1"): 100, ("m", "r2"): 0, ("n", "r9"): 5})
    assert per_token == pytest.approx({("m", "r1"): 3.0})  # no tokens or no energy: absent


def test_unread_counters_and_driver_reloads_add_nothing() -> None:
    meter = EnergyMeter()
    shards = {"r1": ["GPU-a"]}
    beat(meter, {"GPU-a": None}, shards)
    beat(meter, {"GPU-a": None}, shards)
    assert meter.joules == {}
    beat(meter, {"GPU-a": 500.0}, shards)
    beat(meter, {"GPU-a": 20.0}, shards)  # the counter went down: a new baseline
    assert meter.joules == {}
    beat(meter, {"GPU-a": 45.0}, shards)
    assert meter.joules == {"r1": 25.0}
    meter.forget("r1")
    assert meter.joules_per_token({("m", "r1"): 10}) == {}


def test_usage_by_model_shows_joules_per_token_where_read() -> None:
    rows = [
        {"model": "big", "requests": 2, "prompt_tokens": 10, "completion_tokens": 40},
        {"model": "cpu", "requests": 1, "prompt_tokens": 5, "completion_tokens": 5},
    ]
    energy = [{"model": "big", "replica": "r1", "joules": 80.0, "tokens": 40}]
    text = usage_table(rows, "model", energy)
    lines = text.splitlines()
    assert lines[0].split()[-1] == "J/TOKEN"
    assert lines[1].split()[0] == "big" and lines[1].split()[-1] == "2"
    assert lines[2].split()[0] == "cpu" and lines[2].split()[-1] == "-"
    assert "J/TOKEN" not in usage_table(rows, "key", energy)
    assert "J/TOKEN" not in usage_table(rows, "model", [])  # no card's power read anywhere
