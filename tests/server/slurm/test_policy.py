"""Lending by policy, decided from plain inputs (llmgw/server/slurm/policy.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from llmgw.server.slurm.policy import (
    Decision,
    PolicyJob,
    PolicyModel,
    PolicyNode,
    decide,
    span,
)
from llmgw.server.slurm.settings import SlurmPolicy as Policy

NOW = 1_800_000_000.0
MIN = 60.0
LEND = Policy(lend_idle_after=30 * MIN, keep_free_gpus=0)
BOTH = Policy(lend_idle_after=30 * MIN, keep_free_gpus=0, reclaim_when_queued=60.0)


def node(
    id: str,
    stage: str = "serving",
    *,
    idle: float | None = 31 * MIN,
    cards: int = 1,
    ready: bool = True,
    in_set: bool = True,
    replicas: int = 0,
    jobs: tuple[PolicyJob, ...] | None = (),
    steps: int | None = 0,
    returned: float | None = None,
) -> PolicyNode:
    return PolicyNode(
        id,
        in_set,
        stage,  # type: ignore[arg-type]
        ready,
        cards,
        idle,
        replicas,
        jobs,
        steps,
        returned,
    )


def acts(outlook_decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.action, d.node) for d in outlook_decisions]


# ---------------------------------------------------------------- off


def test_off_by_default_decides_nothing_whatever_the_fleet() -> None:
    nodes = [node("n1", idle=10 * 86400), node("n2", "lent")]
    models = [PolicyModel("qwen", queued=3600.0, nowhere="no node fits")]
    outlook = decide(nodes, models, Policy(), NOW, watched=86400)
    assert outlook.decisions == []
    assert outlook.next() == []


def test_reclaim_half_off_never_reclaims_for_a_queue_or_a_homeless_replica() -> None:
    nodes = [node("n1", "lent")]
    models = [PolicyModel("qwen", queued=3600.0, nowhere="no node fits")]
    outlook = decide(nodes, models, LEND, NOW, watched=0)
    assert outlook.decisions == []


def test_lend_half_off_never_lends() -> None:
    policy = Policy(reclaim_when_queued=60.0)
    outlook = decide([node("n1", idle=86400)], [], policy, NOW, watched=86400)
    assert outlook.decisions == []
    assert outlook.next() == ["nothing: no model waits for room (lending by policy is off)"]


# ---------------------------------------------------------------- lending


def test_an_idle_node_is_lent_after_the_set_time_and_not_before() -> None:
    before = decide([node("n3", idle=30 * MIN - 1)], [], LEND, NOW, watched=86400)
    assert before.decisions == []
    assert before.next() == ["lend n3 in 1 s if its cards serve nothing meanwhile (policy: 30 min)"]
    at = decide([node("n3", idle=30 * MIN)], [], LEND, NOW, watched=86400)
    assert acts(at.decisions) == [("lend", "n3")]
    after = decide([node("n3", idle=31 * MIN)], [], LEND, NOW, watched=86400)
    assert after.decisions == [
        Decision("lend", "n3", "n3: its cards served nothing for 31 min (policy: 30 min)")
    ]
    assert after.next() == ["lend n3: its cards served nothing for 31 min (policy: 30 min)"]


def test_a_node_that_never_served_is_idle_for_as_long_as_the_keeper_watched() -> None:
    fresh = decide([node("n3", idle=None)], [], LEND, NOW, watched=29 * MIN)
    assert fresh.decisions == []
    assert fresh.next() == ["lend n3 in 60 s if its cards serve nothing meanwhile (policy: 30 min)"]
    later = decide([node("n3", idle=None)], [], LEND, NOW, watched=45 * MIN)
    assert later.decisions == [
        Decision(
            "lend",
            "n3",
            "n3: its cards served nothing since the keeper began watching 45 min ago "
            "(policy: 30 min)",
        )
    ]


def test_a_cpu_node_is_spoken_of_as_itself() -> None:
    outlook = decide([node("c1", cards=0, idle=2 * 3600)], [], LEND, NOW, watched=0)
    assert outlook.decisions[0].reason == "c1: it served nothing for 2 h (policy: 30 min)"
    waiting = decide([node("c1", cards=0, idle=0)], [], LEND, NOW, watched=0)
    assert waiting.next() == ["lend c1 in 30 min if it serves nothing meanwhile (policy: 30 min)"]


@pytest.mark.parametrize(
    ("why", "changed"),
    [
        ("not in Slurm's set", {"in_set": False}),
        ("not Ready", {"ready": False}),
        ("cordoned by an operator", {"cordoned": True}),
        ("runs a replica", {"replicas": 1}),
        ("already lent", {"stage": "lent"}),
        ("being lent", {"stage": "lending"}),
        ("being taken back", {"stage": "reclaiming"}),
    ],
)
def test_only_a_serving_ready_node_of_the_set_with_no_replica_is_lent(
    why: str, changed: dict[str, object]
) -> None:
    idle = replace(node("n3", idle=10 * 86400), **changed)  # type: ignore[arg-type]
    outlook = decide([idle], [], LEND, NOW, watched=10 * 86400)
    assert outlook.decisions == [], why


def test_every_idle_node_is_lent_in_one_pass_the_longest_idle_first() -> None:
    nodes = [
        node("n1", idle=40 * MIN),
        node("n2", idle=2 * 3600),
        node("n3", idle=5 * MIN),
        node("n4", idle=40 * MIN),
    ]
    outlook = decide(nodes, [], LEND, NOW, watched=86400)
    assert acts(outlook.decisions) == [("lend", "n2"), ("lend", "n1"), ("lend", "n4")]


def test_keep_free_gpus_keeps_that_many_cards_with_llmgw() -> None:
    policy = replace(LEND, keep_free_gpus=4)
    nodes = [
        node("busy", cards=2, replicas=1, idle=0),  # serving, counted, never lent
        node("out", cards=2, in_set=False, idle=86400),  # not Slurm's: counted, never lent
        node("n1", cards=2, idle=3 * 3600),
        node("n2", cards=2, idle=2 * 3600),
        node("lent", "lent", cards=8),  # Slurm's already: not counted
        node("down", cards=8, ready=False, idle=86400),  # NotReady: not counted
        replace(node("kept", cards=8, in_set=False), cordoned=True),  # an operator's
    ]
    outlook = decide(nodes, [], policy, NOW, watched=86400)
    # 8 cards with llmgw: lending n1 leaves 6, n2 then 4, and no more.
    assert acts(outlook.decisions) == [("lend", "n1"), ("lend", "n2")]
    tighter = decide(nodes, [], replace(policy, keep_free_gpus=5), NOW, watched=86400)
    assert acts(tighter.decisions) == [("lend", "n1")]
    none = decide(nodes, [], replace(policy, keep_free_gpus=7), NOW, watched=86400)
    assert none.decisions == []
    assert none.next() == [
        "n1 stays: lending its 2 cards would leave 6 with llmgw (policy: keep 7 free)",
        "n2 stays: lending its 2 cards would leave 6 with llmgw (policy: keep 7 free)",
    ]


def test_keep_free_gpus_passes_over_a_big_node_for_a_small_one() -> None:
    nodes = [node("big", cards=8, idle=3 * 3600), node("small", cards=1, idle=3600)]
    nodes.append(node("busy", cards=2, replicas=1, idle=0))  # 11 cards with llmgw
    both = decide(nodes, [], replace(LEND, keep_free_gpus=2), NOW, watched=86400)
    assert acts(both.decisions) == [("lend", "big"), ("lend", "small")]
    big = decide(nodes, [], replace(LEND, keep_free_gpus=3), NOW, watched=86400)
    assert acts(big.decisions) == [("lend", "big")]
    small = decide(nodes, [], replace(LEND, keep_free_gpus=4), NOW, watched=86400)
    assert acts(small.decisions) == [("lend", "small")]


def test_a_cpu_node_is_lent_whatever_cards_must_stay_free() -> None:
    policy = replace(LEND, keep_free_gpus=100)
    outlook = decide([node("c1", cards=0, idle=86400)], [], policy, NOW, watched=0)
    assert acts(outlook.decisions) == [("lend", "c1")]


def test_nothing_to_lend_says_so() -> None:
    outlook = decide([node("n1", replicas=1)], [], LEND, NOW, watched=0)
    assert outlook.next() == [
        "nothing to lend: no node of Slurm's set is serving, Ready and free of replicas"
    ]


# ---------------------------------------------------------------- reclaiming


def test_a_model_queued_past_the_limit_gets_a_lent_node_back() -> None:
    nodes = [node("n1", replicas=1, idle=0), node("n2", "lent")]
    models = [PolicyModel("qwen", queued=75.0)]
    outlook = decide(nodes, models, BOTH, NOW, watched=86400)
    assert outlook.decisions == [
        Decision(
            "reclaim",
            "n2",
            "n2: model qwen's requests have queued for 75 s (policy: 60 s); n2 runs no job",
        )
    ]
    assert outlook.next() == [
        "reclaim n2: model qwen's requests have queued for 75 s (policy: 60 s); n2 runs no job"
    ]


def test_a_queue_under_the_limit_takes_nothing_back() -> None:
    nodes = [node("n1", replicas=1, idle=0), node("n2", "lent")]
    for queued in (None, 0.0, 59.9):
        outlook = decide(nodes, [PolicyModel("qwen", queued=queued)], BOTH, NOW, watched=0)
        assert outlook.decisions == []
    at = decide(nodes, [PolicyModel("qwen", queued=60.0)], BOTH, NOW, watched=0)
    assert acts(at.decisions) == [("reclaim", "n2")]


def test_a_replica_with_nowhere_to_go_gets_a_lent_node_back() -> None:
    models = [PolicyModel("qwen", nowhere="no node fits (cordoned: 1 node)")]
    outlook = decide([node("n2", "lent")], models, BOTH, NOW, watched=0)
    assert outlook.decisions[0].reason == (
        "n2: a replica of model qwen has nowhere to go (no node fits (cordoned: 1 node)); "
        "n2 runs no job"
    )


def test_a_node_with_no_job_goes_first_then_the_soonest_end_then_the_unknown() -> None:
    def job(end: float | None) -> tuple[PolicyJob, ...]:
        return (PolicyJob("1", end),)

    nodes = [
        node("late", "lent", jobs=(PolicyJob("7", NOW + 3600), PolicyJob("8", NOW + 60)), steps=2),
        node("unknown", "lent", jobs=job(None), steps=1),
        node("soon", "lent", jobs=job(NOW + 300), steps=1),
        node("free", "lent", jobs=(), steps=0),
    ]
    models = [PolicyModel(f"m{i}", nowhere="no node fits") for i in range(5)]
    outlook = decide(nodes, models, BOTH, NOW, watched=0)
    assert acts(outlook.decisions) == [
        ("reclaim", "free"),
        ("reclaim", "soon"),
        ("reclaim", "late"),
        ("reclaim", "unknown"),
    ]
    reasons = [d.reason.split("; ")[-1] for d in outlook.decisions]
    assert reasons == [
        "free runs no job",
        "soon's 1 job end in 5 min",
        "late's 2 jobs end in 60 min",  # the node is free when its last job ends
        "unknown runs 1 job whose end Slurm does not know",
    ]
    assert outlook.waiting == [
        "a replica of model m4 has nowhere to go (no node fits), "
        "and no Ready node is lent to Slurm to take back"
    ]


def test_jobs_not_read_count_as_none_only_when_no_step_runs() -> None:
    down = node("down", "lent", jobs=None, steps=0)  # slurmctld down, nothing running
    busy = node("busy", "lent", jobs=None, steps=3)
    blind = node("blind", "lent", jobs=None, steps=None)
    stepping = node("stepping", "lent", jobs=(), steps=1)  # a step squeue did not list
    models = [PolicyModel("qwen", nowhere="no node fits")]
    for others in ([busy, blind, stepping], [blind, stepping, busy]):
        outlook = decide([*others, down], models, BOTH, NOW, watched=0)
        assert acts(outlook.decisions) == [("reclaim", "down")]
        assert outlook.decisions[0].reason.endswith("down runs no job")
    rest = decide([busy, stepping], models, BOTH, NOW, watched=0)
    assert rest.decisions[0].reason.endswith("busy runs job steps whose end Slurm does not know")


def test_the_fewest_nodes_one_per_starved_model_per_pass() -> None:
    nodes = [node(f"n{i}", "lent") for i in range(1, 5)]
    one = decide(nodes, [PolicyModel("qwen", queued=3600.0)], BOTH, NOW, watched=0)
    assert acts(one.decisions) == [("reclaim", "n1")]
    two = decide(
        nodes,
        [PolicyModel("qwen", queued=3600.0), PolicyModel("llama", nowhere="no node fits")],
        BOTH,
        NOW,
        watched=0,
    )
    assert acts(two.decisions) == [("reclaim", "n1"), ("reclaim", "n2")]
    # The homeless replica first, then the longest queue.
    assert "llama" in two.decisions[0].reason and "qwen" in two.decisions[1].reason


def test_the_most_starved_model_gets_the_only_lent_node() -> None:
    models = [
        PolicyModel("a", queued=70.0),
        PolicyModel("b", queued=300.0),
        PolicyModel("c", queued=90.0),
    ]
    outlook = decide([node("n2", "lent")], models, BOTH, NOW, watched=0)
    assert len(outlook.decisions) == 1 and "model b's" in outlook.decisions[0].reason
    assert [w.split("'")[0] for w in outlook.waiting] == ["model c", "model a"]


def test_a_node_on_its_way_back_counts_for_one_starved_model() -> None:
    models = [PolicyModel("qwen", queued=3600.0)]
    going = [node("n1", "reclaiming", jobs=(PolicyJob("4", NOW + 20),), steps=1)]
    lent = [node("n2", "lent")]
    outlook = decide(going + lent, models, BOTH, NOW, watched=0)
    assert outlook.decisions == []
    assert outlook.next() == [
        "model qwen's requests have queued for 60 min (policy: 60 s): n1 is being taken back for it"
    ]
    back = [node("n1", idle=10.0, returned=10.0)]
    assert decide(back + lent, models, BOTH, NOW, watched=0).decisions == []
    # Back long enough and the model still waits: the next one.
    settled = [node("n1", idle=10.0, returned=60.0, replicas=1)]
    assert acts(decide(settled + lent, models, BOTH, NOW, watched=0).decisions) == [
        ("reclaim", "n2")
    ]
    # A second starved model takes the next lent node meanwhile.
    two = [*models, PolicyModel("llama", nowhere="no node fits")]
    assert acts(decide(going + lent, two, BOTH, NOW, watched=0).decisions) == [("reclaim", "n2")]


@pytest.mark.parametrize(
    ("why", "changed"),
    [
        ("not in Slurm's set", {"in_set": False}),
        ("not Ready", {"ready": False}),
        ("serving", {"stage": "serving"}),
        ("still lending", {"stage": "lending"}),
    ],
)
def test_only_a_lent_ready_node_of_the_set_is_taken_back(
    why: str, changed: dict[str, object]
) -> None:
    other = replace(node("n2", "lent"), **changed)  # type: ignore[arg-type]
    outlook = decide([other], [PolicyModel("qwen", queued=90.0)], BOTH, NOW, watched=0)
    assert outlook.decisions == [], why


def test_never_lend_and_reclaim_in_one_pass() -> None:
    nodes = [node("idle", idle=86400), node("n2", "lent")]
    models = [PolicyModel("qwen", queued=90.0)]
    outlook = decide(nodes, models, BOTH, NOW, watched=86400)
    assert acts(outlook.decisions) == [("reclaim", "n2")]
    # Starved with nothing to take back: still nothing lent.
    starved = decide([node("idle", idle=86400)], models, BOTH, NOW, watched=86400)
    assert starved.decisions == []
    assert starved.next() == [
        "model qwen's requests have queued for 90 s (policy: 60 s), "
        "and no Ready node is lent to Slurm to take back"
    ]
    # A node just taken back for a model that still waits is not lent again.
    back = [node("n2", idle=None, returned=5.0)]
    assert decide(back, models, BOTH, NOW, watched=86400).decisions == []


# ---------------------------------------------------------------- as a whole


def test_the_same_inputs_give_the_same_decisions_in_any_order() -> None:
    rng = random.Random(7)
    stages = ("serving", "lending", "lent", "reclaiming")
    for _ in range(200):
        nodes = [
            node(
                f"n{i}",
                rng.choice(stages),
                idle=rng.choice([None, 0.0, 29 * MIN, 31 * MIN, 5 * 3600]),
                cards=rng.choice([0, 1, 2, 8]),
                ready=rng.random() > 0.2,
                in_set=rng.random() > 0.1,
                replicas=rng.choice([0, 0, 1]),
                jobs=rng.choice([None, (), (PolicyJob("1", NOW + rng.randint(0, 999)),)]),
                steps=rng.choice([None, 0, 1]),
                returned=rng.choice([None, 5.0, 600.0]),
            )
            if rng.random() > 0.1
            else replace(node(f"n{i}", idle=5 * 3600), cordoned=True)
            for i in range(6)
        ]
        models = [
            PolicyModel(
                f"m{i}",
                queued=rng.choice([None, 30.0, 61.0, 999.0]),
                nowhere=rng.choice([None, None, "no node fits"]),
            )
            for i in range(3)
        ]
        policy = Policy(
            rng.choice([None, 30 * MIN]), rng.choice([0, 2, 9]), rng.choice([None, 60.0])
        )
        first = decide(nodes, models, policy, NOW, watched=3600)
        shuffled_nodes, shuffled_models = nodes[:], models[:]
        rng.shuffle(shuffled_nodes)
        rng.shuffle(shuffled_models)
        again = decide(shuffled_nodes, shuffled_models, policy, NOW, watched=3600)
        assert again == first
        kinds = {d.action for d in first.decisions}
        assert len(kinds) <= 1, "a pass lends or reclaims, never both"
        by_id = {n.id: n for n in nodes}
        for d in first.decisions:
            chosen = by_id[d.node]
            assert chosen.in_set and chosen.ready and d.reason.startswith(f"{d.node}: ")
            if d.action == "lend":
                assert chosen.stage == "serving" and not chosen.replicas and not chosen.cordoned
            else:
                assert chosen.stage == "lent"
        if not policy.on:
            assert first.decisions == [] and first.waiting == []
        if policy.reclaim_when_queued is None:
            assert "reclaim" not in kinds
        if policy.lend_idle_after is None:
            assert "lend" not in kinds
        lent_cards = sum(by_id[d.node].cards for d in first.decisions if d.action == "lend")
        free = sum(
            n.cards
            for n in nodes
            if n.ready and not n.cordoned and (not n.in_set or n.stage == "serving")
        )
        if lent_cards:
            assert free - lent_cards >= policy.keep_free_gpus


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (-3, "0 s"),
        (75, "75 s"),
        (119, "119 s"),
        (120, "2 min"),
        (1860, "31 min"),
        (7199, "119 min"),
        (7200, "2 h"),
        (172800, "2 d"),
    ],
)
def test_span_says_a_duration_as_people_do(seconds: float, words: str) -> None:
    assert span(seconds) == words
