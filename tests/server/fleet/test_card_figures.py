"""Heartbeats with the cards' moving figures alone: both ends of a stream joined in
memory. The agent sends a card's steady facts (uuid, name, driver, limits...) only to a
control plane that says it takes figures, and only when they changed; the control
plane's stream makes whole cards again, so what is reported is what was read."""

from __future__ import annotations

import dataclasses

from llmgw.server.fleet import stream as server
from llmgw.wire import GPU, Heartbeat, Registered
from llmgw.wire.hardware import CARD_FIGURES
from tests.support.streampair import Pair

GIB = 1 << 30


def _cards(step: int, driver: str = "550.54.15", count: int = 2) -> list[GPU]:
    return [
        GPU(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            memory_total=80 * GIB,
            memory_used=(40 + step) * GIB,
            utilization=50 + step,
            driver=driver,
            bus_id=f"00000000:{i:02X}:00.0",
            power=600.0 + step,
            power_limit=700.0,
            throttle=[],
            pcie_gen_max=5,
        )
        for i in range(count)
    ]


def _pair(features: list[str]) -> Pair:
    pair = Pair()
    pair.settle()
    pair.node.send(Registered(node_id="n1", heartbeat_interval=5.0, features=features))
    pair.settle()
    assert pair.agent.registered is not None
    return pair


def _beat(pair: Pair, step: int, driver: str = "550.54.15", count: int = 2) -> Heartbeat:
    """One heartbeat, read by the control plane before the next is queued (the outbox
    would make two unread ones one)."""
    beat = pair.agent.heartbeat(float(step), gpus=_cards(step, driver, count))
    pair.settle()
    return beat


def _reported(pair: Pair) -> list[Heartbeat]:
    pair.settle()
    beats = [
        e.message
        for e in pair.to_node
        if isinstance(e, server.Reported) and isinstance(e.message, Heartbeat)
    ]
    pair.to_node.clear()
    return beats


def test_figures_alone_once_the_control_plane_has_the_cards_and_whole_cards_reported() -> None:
    pair = _pair([CARD_FIGURES])
    sent = [_beat(pair, step) for step in range(3)]
    # The first goes whole; the next two carry only what moves.
    assert sent[0].gpus is not None and sent[0].gpu_figures is None
    assert all(b.gpus is None and b.gpu_figures is not None for b in sent[1:])
    assert sent[1].gpu_figures is not None and sent[1].gpu_figures[1].power == 601.0
    # The control plane reports whole cards, each as the agent read it.
    beats = _reported(pair)
    assert [b.gpus for b in beats] == [_cards(0), _cards(1), _cards(2)]
    assert all(b.gpu_figures is None for b in beats)


def test_a_changed_steady_fact_or_card_count_sends_the_cards_whole_again() -> None:
    pair = _pair([CARD_FIGURES])
    _beat(pair, 0)
    upgraded = _beat(pair, 1, driver="580.105.08")
    assert upgraded.gpus is not None and upgraded.gpu_figures is None
    fewer = _beat(pair, 2, driver="580.105.08", count=1)
    assert fewer.gpus is not None
    after = _beat(pair, 3, driver="580.105.08", count=1)
    assert after.gpus is None and after.gpu_figures is not None
    beats = _reported(pair)
    assert beats[-1].gpus == _cards(3, driver="580.105.08", count=1)
    assert beats[1].gpus is not None and beats[1].gpus[0].driver == "580.105.08"


def test_a_control_plane_that_does_not_say_it_takes_figures_gets_whole_cards() -> None:
    pair = _pair([])
    sent = [_beat(pair, step) for step in range(3)]
    assert all(b.gpus is not None and b.gpu_figures is None for b in sent)
    assert [b.gpus for b in _reported(pair)] == [_cards(0), _cards(1), _cards(2)]


def test_figures_queued_behind_whole_cards_are_laid_over_them() -> None:
    """Two heartbeats the agent's outbox made one (the control plane did not read in
    between): whole cards then figures, and figures then whole cards."""
    pair = _pair([CARD_FIGURES])
    pair.agent.heartbeat(1.0, gpus=_cards(0))
    pair.agent.heartbeat(2.0, gpus=_cards(1))
    assert [b.gpus for b in _reported(pair)] == [_cards(1)]
    pair.agent.heartbeat(3.0, gpus=_cards(2))
    pair.agent.heartbeat(4.0, gpus=_cards(3, count=3))
    assert [b.gpus for b in _reported(pair)] == [_cards(3, count=3)]


def test_figures_for_cards_the_stream_never_carried_end_it_naming_why() -> None:
    pair = _pair([CARD_FIGURES])
    pair.agent.heartbeat(1.0, gpus=_cards(0))
    pair.settle()
    # A broken agent: two cards' figures after one card whole.
    beat = pair.agent.heartbeat(2.0, gpus=_cards(1))
    assert beat.gpu_figures is not None
    pair.node.cards = _cards(0, count=1)
    pair.settle()
    ended = [e for e in pair.to_node if isinstance(e, server.Ended)]
    assert ended and "figures of 2 cards" in ended[0].reason
    assert "last cards were 1" in ended[0].reason


def test_figures_leave_out_every_steady_fact() -> None:
    pair = _pair([CARD_FIGURES])
    pair.agent.heartbeat(1.0, gpus=_cards(0))
    beat = pair.agent.heartbeat(2.0, gpus=_cards(1))
    assert beat.gpu_figures is not None
    names = {f.name for f in dataclasses.fields(beat.gpu_figures[0])}
    assert not names & {"uuid", "name", "driver", "bus_id", "memory_total", "power_limit"}


def test_an_older_agent_that_sends_whole_cards_is_read_as_before() -> None:
    pair = _pair([CARD_FIGURES])
    # An agent from before gpu_figures reads no features in Registered.
    pair.agent.registered = Registered(node_id="n1", heartbeat_interval=5.0)
    sent = [_beat(pair, step) for step in range(3)]
    assert all(b.gpus is not None and b.gpu_figures is None for b in sent)
    assert [b.gpus for b in _reported(pair)] == [_cards(0), _cards(1), _cards(2)]
