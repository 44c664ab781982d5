"""MODELS.yaml: what ``ctl model serve`` takes, checked by the API's reader and the
catalog's own checks, and the speeds a replica runs at where it is placed."""

from __future__ import annotations

import pytest

from llmgw.modelkit.sizing import cpu_tokens_per_second
from llmgw.sim.cards import CARDS, GIB, SimError, parse_nodes
from llmgw.sim.fleet import generated, read_fleet
from llmgw.sim.models import PREFILL_EFFICIENCY, read_models, speed
from tests.sim.conftest import FIXTURES, LLAMA_8B, MODELS, Write

H100 = [80 * GIB]


def test_models_are_the_catalogs_own(write: Write) -> None:
    sims = read_models(write("m.yaml", MODELS), H100, 2048 * GIB)
    by_name = {s.model.name: s for s in sims}
    big = by_name["llama-70b"].model
    profile = big.profiles[0]
    assert (profile.engine, profile.cards, profile.replicas) == ("vllm", 4, 2)
    assert big.context == 8192 and big.slots == 16
    # Worked out from the shape as `serve` works it out: 131 GiB over 4 cards and more.
    assert 131 * GIB / 4 < profile.card_memory < 80 * GIB
    assert big.weight_bytes == 131 * GIB


def test_a_size_may_be_written_as_text(write: Write) -> None:
    entry = {
        "source": "hf:a/b",
        "gpus": 0,
        "memory": "8GiB",
        "tokens_per_second": 12.5,
        "prefill_tokens_per_second": 200,
    }
    (sim,) = read_models(write("m.yaml", [entry]), H100, 512 * GIB)
    assert sim.model.name == "b" and sim.model.profiles[0].memory == 8 * GIB
    assert sim.tokens_per_second == 12.5 and sim.prefill_tokens_per_second == 200.0


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"source": "hf:a/b", "gpus": 1}, "model 1 (b): give its shape"),
        ({"source": "hf:a/b", "memory": "8GiB", "gpu": 1}, "model 1: gpu: unknown field"),
        ({"source": "hf:a/b", "memory": "lots"}, "model 1: memory: 'lots' is not a size"),
        ({"source": "hf:a/b", "memory": "8GiB", "replicas": 2000}, "model 1: replicas"),
        (
            {"source": "hf:a/b", "memory": "8GiB", "engine": "vllm", "gpus": 1, "args": ["--port"]},
            "model 1 (b): profiles.default",
        ),
        (
            {"source": "hf:a/b", "shape": {"file_bytes": "1GiB", "legs": 2}},
            "model 1: shape.legs is not a figure",
        ),
        ({"source": "hf:a/b", "shape": {"layers": 2}}, "shape.file_bytes"),
        (
            {"source": "hf:a/b", "memory": "1GiB", "tokens_per_second": -1},
            "tokens_per_second must be a number",
        ),
    ],
)
def test_a_bad_model_is_named(write: Write, entry: dict[str, object], said: str) -> None:
    path = write("m.yaml", [entry])
    with pytest.raises(SimError) as caught:
        read_models(path, H100, 512 * GIB)
    assert said in str(caught.value)
    assert str(caught.value).startswith(f"--models {path}: ")


def test_two_models_of_one_name_are_refused(write: Write) -> None:
    with pytest.raises(SimError, match="llama-8b is named twice"):
        read_models(write("m.yaml", [MODELS[0], MODELS[0]]), H100, 512 * GIB)


def test_speeds_come_from_the_cards_the_replica_was_given(write: Write) -> None:
    sims = {s.model.name: s for s in read_models(write("m.yaml", MODELS), H100, 2048 * GIB)}
    view = generated(parse_nodes("1x8xH100"))["gpu1"]
    uuids = [g.uuid for g in view.figures().gpus]
    one = speed(sims["llama-8b"], view, uuids[:1])
    four = speed(sims["llama-70b"], view, uuids[:4])
    h100 = CARDS["h100"]
    shape = sims["llama-8b"].shape
    assert shape is not None
    # Decode reads the weights once a token, at the cards' memory rate (the planner's rule).
    assert one.decode == pytest.approx(cpu_tokens_per_second(shape, h100.bandwidth_gbs))
    assert one.prefill == pytest.approx(
        h100.tflops * 1e12 * PREFILL_EFFICIENCY / (2 * LLAMA_8B["parameters"])  # type: ignore[operator]
    )
    assert one.power_w == h100.power_w and four.power_w == 4 * h100.power_w
    assert four.decode < one.decode


def test_a_speed_that_cannot_be_worked_out_asks_for_the_measured(write: Write) -> None:
    nodes = read_fleet(FIXTURES / "nodes.json")
    cpu_model = {"source": "hf:a/c", "shape": LLAMA_8B}
    (sim,) = read_models(write("m.yaml", [cpu_model]), H100, 512 * GIB)
    with pytest.raises(SimError, match="give prefill_tokens_per_second as measured"):
        speed(sim, nodes["cpu-a"], [])
    measured = {**cpu_model, "prefill_tokens_per_second": 150}
    (sim,) = read_models(write("m.yaml", [measured]), H100, 512 * GIB)
    on_cpu = speed(sim, nodes["cpu-a"], [])
    assert on_cpu.prefill == 150.0 and on_cpu.power_w is None
    assert on_cpu.decode == pytest.approx(cpu_tokens_per_second(sim.shape, 180.0))  # type: ignore[arg-type]
