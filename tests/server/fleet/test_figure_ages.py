"""Figures' ages on the control plane: each figure keeps when it was read (by the
agent's word, else when its heartbeat came); one older than 30 s, or one the agent says
it could not read, is not live: the API shows it with its age and as stale, /metrics
leaves it out (a card keeping what it is), and a warning the heartbeats speak for
replaces the Register's word on the same tool."""

from __future__ import annotations

from pathlib import Path

from llmgw.server.fleet.exposition import fleet_metrics
from llmgw.server.fleet.figures import STALE_AFTER, LiveFigures, NodeFigures, node_warnings
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.store import SQLiteStore
from llmgw.wire import GPU, Heartbeat, HostFacts, Register
from llmgw.wire.hardware import NodeVitals
from llmgw.wire.states import NodeState
from tests.support import wiring

NOW = 1_800_000_000.0
CARD = GPU(
    index=0,
    uuid="GPU-a",
    name="NVIDIA H100 80GB HBM3",
    memory_total=80 << 30,
    memory_used=1 << 30,
    utilization=40,
    temperature=31,
    power=120.5,
)
VITALS = NodeVitals(cpu_temperatures={"package0": 50.0})


class FakeSession:
    def close(self, reason: str) -> None:
        pass


def test_a_figure_is_live_for_30_s_from_when_the_agent_read_it() -> None:
    live = LiveFigures()
    live.take(Heartbeat(seq=1, gpus=[CARD], cpu_percent=5.0, ages={"gpus": 4.0}), NOW)
    assert live.age("gpus", NOW) == 4.0  # read 4 s before the heartbeat came
    assert live.age("cpu_percent", NOW) == 0.0  # no age given: read for this heartbeat
    assert live.is_live("gpus", NOW + STALE_AFTER - 4.0)
    assert not live.is_live("gpus", NOW + STALE_AFTER - 3.9)
    # A heartbeat without the figure leaves it and its age; one that gives only its age
    # (the agent's latest read, not sent again) moves the age.
    live.take(Heartbeat(seq=2, cpu_percent=6.0), NOW + 10)
    assert live.age("gpus", NOW + 10) == 14.0 and live.age("cpu_percent", NOW + 10) == 0.0
    live.take(Heartbeat(seq=3, ages={"gpus": 1.0}), NOW + 20)
    assert live.age("gpus", NOW + 20) == 1.0
    assert live.ages(NOW + 20) == {"cpu_percent": 10.0, "gpus": 1.0}
    assert live.age("vitals", NOW) is None and not live.is_live("vitals", NOW)  # never read


def test_what_the_agent_could_not_read_is_not_live_until_it_reads_it() -> None:
    live = LiveFigures()
    live.take(Heartbeat(seq=1, gpus=[CARD], ages={"gpus": 0.5}), NOW)
    live.take(Heartbeat(seq=2, ages={}, unread=["gpus", "gpu_health"]), NOW + 5)
    assert not live.is_live("gpus", NOW + 5) and live.age("gpus", NOW + 5) == 5.5
    assert live.gpus == [CARD]  # kept for placement, not shown as now
    live.take(Heartbeat(seq=3, gpus=[CARD], ages={"gpus": 0.2}), NOW + 10)
    assert live.is_live("gpus", NOW + 10)


def test_the_slow_card_figures_are_live_for_30_s_as_the_others() -> None:
    live = LiveFigures()
    live.take(Heartbeat(seq=1, ages={"gpu_health": 14.0}), NOW)
    assert live.is_live("gpu_health", NOW + 16)  # read every 15 s: at most 30 s old
    assert not live.is_live("gpu_health", NOW + 17)


def test_shown_figures_keep_a_stale_cards_identity_only() -> None:
    facts = HostFacts(hostname="n", os="linux", arch="x86_64", memory_total=100, gpus=[CARD])
    live = LiveFigures.registered(NOW)
    live.take(Heartbeat(seq=1, gpus=[CARD], memory_available=50), NOW)
    fresh = NodeFigures.shown(facts, live, NOW + 29)
    assert fresh.gpus[0].temperature == 31 and fresh.memory_available == 50
    old = NodeFigures.shown(facts, live, NOW + 31)
    (card,) = old.gpus
    assert (card.uuid, card.name, card.memory_total) == ("GPU-a", CARD.name, 80 << 30)
    assert (card.temperature, card.utilization, card.memory_used, card.power) == (None,) * 4
    assert old.memory_available is None
    # Placement still reads the last copy: a hung tool does not empty a node's cards.
    assert NodeFigures.read(facts, live).gpus[0].memory_used == 1 << 30


def _metrics_node(read_at: float, unread: list[str] | None = None) -> NodeView:
    v = NodeView(id="n1", cert_serial=1, state=NodeState.READY, last_seen=NOW)
    v.facts = HostFacts(hostname="n1", os="linux", arch="x86_64", memory_total=100)
    v.live = LiveFigures()
    ages = {"gpus": NOW - read_at, "vitals": NOW - read_at}
    v.live.take(Heartbeat(seq=1, gpus=[CARD], vitals=VITALS, ages=ages, unread=unread), NOW)
    return v


def _sample(text: str, name: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return line.rsplit(" ", 1)[1]
    return None


def test_metrics_leave_out_what_is_not_live() -> None:
    fresh = "\n".join(fleet_metrics([_metrics_node(NOW - 3)], now=NOW))
    assert _sample(fresh, "llmgw_gpu_temperature_celsius") == "31"
    assert _sample(fresh, "llmgw_gpu_busy_ratio") == "0.4"
    assert _sample(fresh, "llmgw_gpu_memory_used_bytes") == str(1 << 30)
    assert _sample(fresh, "llmgw_node_cpu_temperature_celsius") == "50"

    old = "\n".join(fleet_metrics([_metrics_node(NOW - 31)], now=NOW))
    assert _sample(old, "llmgw_gpu_temperature_celsius") is None
    assert _sample(old, "llmgw_gpu_busy_ratio") is None
    assert _sample(old, "llmgw_gpu_memory_used_bytes") is None
    assert _sample(old, "llmgw_node_cpu_temperature_celsius") is None
    # What the card is still stands: its size is no reading.
    assert _sample(old, "llmgw_gpu_memory_total_bytes") == str(80 << 30)
    assert _sample(old, "llmgw_node_up") == "1"

    unread = "\n".join(fleet_metrics([_metrics_node(NOW - 3, ["gpus"])], now=NOW))
    assert _sample(unread, "llmgw_gpu_temperature_celsius") is None
    assert _sample(unread, "llmgw_node_cpu_temperature_celsius") == "50"


async def test_the_api_gives_each_figure_its_age_and_says_which_are_stale(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    reg = NodeRegistry(store, heartbeat_interval=5.0, missed_heartbeats=3, hooks=wiring.QUIET)
    await reg.enrolled("n1", 42)
    host = HostFacts(hostname="n1", os="linux", arch="x86_64", memory_total=100, gpus=[CARD])
    await reg.register(Register(node_id="n1", version="0.1", host=host), FakeSession())
    shown = reg.nodes["n1"].as_json()
    assert shown["stale_figures"] == [] and shown["figure_ages"]["gpus"] < 5

    reg.heartbeat("n1", Heartbeat(seq=1, gpus=[CARD], vitals=VITALS, ages={"gpus": 2.0}))
    shown = reg.nodes["n1"].as_json()
    assert 2.0 <= shown["figure_ages"]["gpus"] < 5 and shown["stale_figures"] == []
    assert shown["gpus"][0]["temperature"] == 31

    # The agent's latest read is 40 s old: shown with its age, and as stale.
    reg.heartbeat("n1", Heartbeat(seq=2, ages={"gpus": 40.0}))
    shown = reg.nodes["n1"].as_json()
    assert shown["figure_ages"]["gpus"] >= 40 and shown["stale_figures"] == ["gpus"]
    assert shown["gpus"][0]["temperature"] == 31  # the figure, for clients to judge

    reg.heartbeat("n1", Heartbeat(seq=3, unread=["gpus", "gpu_health"]))
    assert reg.nodes["n1"].as_json()["stale_figures"] == ["gpus"]
    reg.heartbeat("n1", Heartbeat(seq=4, gpus=[CARD], ages={"gpus": 0.1}))
    assert reg.nodes["n1"].as_json()["stale_figures"] == []
    await store.close()


async def test_the_history_keeps_no_old_figure_as_a_heartbeats(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    await store.open()
    reg = NodeRegistry(store, heartbeat_interval=5.0, missed_heartbeats=3, hooks=wiring.QUIET)
    for node in ("hung", "fine"):
        await reg.enrolled(node, 1)
        host = HostFacts(hostname=node, os="linux", arch="x86_64", memory_total=100, gpus=[CARD])
        await reg.register(Register(node_id=node, version="0.1", host=host), FakeSession())
    # The agent's latest card read is 40 s old (its nvidia-smi hangs): not this beat's.
    reg.heartbeat("hung", Heartbeat(seq=1, cpu_percent=3.0, ages={"gpus": 40.0}))
    reg.heartbeat("fine", Heartbeat(seq=1, cpu_percent=3.0, gpus=[CARD], ages={"gpus": 1.0}))
    hung, fine = reg.history.series("hung", 1), reg.history.series("fine", 1)
    assert hung is not None and fine is not None
    assert hung["gpus"][0]["temperature"][-1] is None
    assert hung["gpus"][0]["memory_total"][-1] == 80 << 30  # what the card is
    assert hung["cpu_percent"][-1] == 3.0  # read for this heartbeat
    assert fine["gpus"][0]["temperature"][-1] == 31
    await store.close()


def test_the_heartbeats_warnings_replace_the_registers_on_the_same_tool() -> None:
    said = "nvidia-smi: no answer in 10 s (since 01:02:03 UTC). Fix: run `nvidia-smi` by hand"
    avx = "cpu: no AVX2. Fix: use another node"
    facts = HostFacts(hostname="n", os="linux", arch="x86_64", warnings=[avx, said])
    live = LiveFigures()
    assert node_warnings(facts, live) == [avx, said]  # no heartbeat yet
    live.take(Heartbeat(seq=1, health_warnings=[said], ages={}), NOW)
    assert node_warnings(facts, live) == [avx, said]  # not twice
    live.take(Heartbeat(seq=2, health_warnings=[], ages={}), NOW + 5)
    assert node_warnings(facts, live) == [avx]  # nvidia-smi answers again
    # An agent that sends no ages says nothing of its tools on its heartbeats.
    older = LiveFigures()
    older.take(Heartbeat(seq=1, health_warnings=[]), NOW)
    assert node_warnings(facts, older) == [avx, said]
