"""The simulated fleet: generated from ``--nodes``, or read from a recorded
``ctl nodes --json`` (as JSON or YAML of the same shape)."""

from __future__ import annotations

import json

import pytest
import yaml

from llmgw.sim.cards import CARDS, SimError, by_name, parse_nodes
from llmgw.sim.fleet import SimSession, generated, read_fleet
from llmgw.wire.states import NodeState
from tests.sim.conftest import FIXTURES, Write

GIB = 1024**3


def test_a_generated_fleet_has_the_cards_it_was_asked_for() -> None:
    nodes = generated(parse_nodes("3x8xH200"))
    assert sorted(nodes) == ["gpu1", "gpu2", "gpu3"]
    gpu2 = nodes["gpu2"]
    gpus = gpu2.figures().gpus
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H200"}
    assert {g.memory_total for g in gpus} == {141 * GIB}
    assert {g.compute_capability for g in gpus} == {"9.0"}
    assert len({g.uuid for v in nodes.values() for g in v.figures().gpus}) == 24
    assert gpu2.state == NodeState.READY and isinstance(gpu2.session, SimSession)
    assert gpu2.engine_names() == {"llama.cpp", "vllm"}


def test_nodes_without_cards_are_named_apart() -> None:
    nodes = generated(parse_nodes("2x0"))
    assert sorted(nodes) == ["cpu1", "cpu2"]
    assert not nodes["cpu1"].figures().gpus


def test_an_unknown_card_type_lists_the_known() -> None:
    with pytest.raises(SimError) as caught:
        parse_nodes("10x8xH800")
    said = str(caught.value)
    assert "'H800'" in said
    for card in CARDS.values():
        assert card.key in said


@pytest.mark.parametrize("spec", ["2000", "x8xH100", "2000x8", "ax8xH100", "0x8xH100", "5x65xH100"])
def test_a_bad_nodes_spec_says_the_form(spec: str) -> None:
    with pytest.raises(SimError, match="--nodes"):
        parse_nodes(spec)


def test_a_reported_card_name_is_matched_to_the_table() -> None:
    assert by_name("NVIDIA H100 80GB HBM3") == CARDS["h100"]
    assert by_name("NVIDIA H100 PCIe") == CARDS["h100"]
    assert by_name("NVIDIA L40S") == CARDS["l40s"]
    assert by_name("Tesla T4") is None


def test_a_recorded_fleet_is_read_as_the_registry_would_hold_it() -> None:
    nodes = read_fleet(FIXTURES / "nodes.json")
    assert sorted(nodes) == ["cpu-a", "h100-a", "h100-b", "l40s-a"]
    h100 = nodes["h100-b"]
    assert h100.labels == {"zone": "b"}
    assert h100.address == "10.0.0.2"
    gpus = h100.figures().gpus
    assert len(gpus) == 8 and gpus[0].name == "NVIDIA H100 80GB HBM3"
    # As if it ran nothing: what runs is MODELS.yaml alone.
    assert {g.memory_used for g in gpus} == {0}
    facts = h100.facts
    assert facts is not None and facts.memory_available == facts.memory_total
    assert h100.engine_names() == {"llama.cpp", "vllm"}
    assert h100.installable == ["vllm", "sglang"]
    assert nodes["cpu-a"].live.memory_read_gbs == 180.0
    assert nodes["l40s-a"].figures().gpus[0].compute_capability == "8.9"


def test_yaml_of_the_same_shape_reads_the_same(write: Write) -> None:
    data = json.loads((FIXTURES / "nodes.json").read_text())
    from_yaml = read_fleet(write("nodes.yaml", yaml.safe_dump(data)))
    from_json = read_fleet(FIXTURES / "nodes.json")
    assert {n: v.figures() for n, v in from_yaml.items()} == {
        n: v.figures() for n, v in from_json.items()
    }


def test_a_bad_fleet_file_names_the_node(write: Write) -> None:
    with pytest.raises(SimError, match="give a list of nodes"):
        read_fleet(write("n.json", {"id": "a"}))
    with pytest.raises(SimError, match="node 2: a node is an object with its id"):
        read_fleet(write("n.json", [{"id": "a"}, {"name": "b"}]))
    with pytest.raises(SimError, match="node 2: a is listed twice"):
        read_fleet(write("n.json", [{"id": "a"}, {"id": "a"}]))
    with pytest.raises(SimError, match=r"node 1 \(a\): .*memory_total"):
        read_fleet(
            write(
                "n.json",
                [
                    {
                        "id": "a",
                        "gpus": [{"index": 0, "uuid": "G", "name": "x", "memory_total": "lots"}],
                    }
                ],
            )
        )
    with pytest.raises(SimError, match="cannot read it"):
        read_fleet(FIXTURES / "absent.json")
