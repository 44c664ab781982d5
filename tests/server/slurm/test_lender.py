"""Lending by policy at work (llmgw/server/slurm/lender.py): its inputs gathered from
node views and the gateway's figures, its decisions carried out, what it would do next;
over a stand-in for the Slurm service that moves stages as the service does."""

from __future__ import annotations

from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.slurm.lender import Lender, Sources
from llmgw.server.slurm.policy import Decision, Stage
from llmgw.server.slurm.settings import SlurmPolicy as Policy
from llmgw.wire.hardware import GPU, HostFacts
from llmgw.wire.messages import ShardStatus, SlurmJob, SlurmStatus
from llmgw.wire.states import NodeState, ShardState

MIN = 60.0
WALL = 1_800_000_000.0


def view(node_id: str, cards: int = 1, replicas: int = 0) -> NodeView:
    facts = HostFacts(
        hostname=node_id,
        os="linux",
        arch="x86_64",
        gpus=[GPU(index=i, uuid=f"GPU-{node_id}-{i}", name="NVIDIA L4") for i in range(cards)],
    )
    v = NodeView(id=node_id, cert_serial=1, state=NodeState.READY, facts=facts)
    for i in range(replicas):
        rid = f"m.default.{i:08d}"
        v.shards[rid] = ShardStatus(replica_id=rid, state=ShardState.READY, port=9000 + i)
    return v


class Fleet:
    """The nodes, the gateway's figures and a Slurm service's stages, all in the test's
    hands; ``act`` moves a node's stage as the service's lend and reclaim do."""

    def __init__(self, *views: NodeView) -> None:
        self.views = {v.id: v for v in views}
        self.stage: dict[str, Stage] = {v.id: "serving" for v in views}
        self.policy = Policy()
        self.now = 1000.0
        self.served: dict[str, float] = {}
        self.backlogs: dict[str, float] = {}
        self.unplaced: dict[str, str] = {}
        self.acted: list[Decision] = []
        self.refuse: str | None = None

    async def act(self, decision: Decision) -> None:
        if self.refuse is not None:
            raise Refusal(409, "nowhere_to_go", self.refuse)
        self.acted.append(decision)
        self.stage[decision.node] = "lent" if decision.action == "lend" else "reclaiming"

    def lender(self) -> Lender:
        sources = Sources(
            policy=lambda: self.policy,
            stages=lambda: dict(self.stage),
            nodes=lambda: self.views,
            served=lambda: self.served,
            backlogs=lambda: self.backlogs,
            unplaced=lambda: self.unplaced,
        )
        return Lender(sources, self.act, clock=lambda: self.now, wall=lambda: WALL)


def lends(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.action, d.node) for d in decisions]


async def test_off_by_default_nothing_happens_however_long_a_node_idles() -> None:
    fleet = Fleet(view("n1"), view("n2"))
    lender = fleet.lender()
    fleet.now += 30 * 86400
    assert await lender.pass_once() == []
    assert fleet.acted == [] and lender.next == []


async def test_an_idle_node_is_lent_after_the_set_time_and_not_before() -> None:
    fleet = Fleet(view("n1", replicas=1), view("n2"))
    fleet.policy = Policy(lend_idle_after=30 * MIN)
    lender = fleet.lender()
    fleet.served = {"n1": fleet.now, "n2": fleet.now}  # both served at the start
    fleet.now += 30 * MIN - 1
    assert await lender.pass_once() == []
    assert lender.next == ["lend n2 in 1 s if its cards serve nothing meanwhile (policy: 30 min)"]
    fleet.now += 1
    done = await lender.pass_once()
    assert done == [
        Decision("lend", "n2", "n2: its cards served nothing for 30 min (policy: 30 min)")
    ]
    # n1 serves a replica: never lent; the next pass has nothing more to lend.
    assert lender.next == [
        "nothing to lend: no node of Slurm's set is serving, Ready and free of replicas"
    ]


async def test_a_request_served_meanwhile_starts_the_wait_again() -> None:
    fleet = Fleet(view("n2"))
    fleet.policy = Policy(lend_idle_after=30 * MIN)
    lender = fleet.lender()
    fleet.now += 20 * MIN
    fleet.served["n2"] = fleet.now
    fleet.now += 20 * MIN
    assert await lender.pass_once() == []
    fleet.now += 10 * MIN
    assert lends(await lender.pass_once()) == [("lend", "n2")]


async def test_a_node_that_ran_a_replica_waits_from_when_it_was_last_seen_with_one() -> None:
    busy = view("n2", replicas=1)
    fleet = Fleet(busy)
    fleet.policy = Policy(lend_idle_after=30 * MIN)
    lender = fleet.lender()
    fleet.now += 60 * MIN
    assert await lender.pass_once() == []  # it runs a replica: seen busy now
    busy.shards.clear()  # its replica moved away; it never served a request here
    fleet.now += 29 * MIN
    assert await lender.pass_once() == []
    fleet.now += 1 * MIN
    assert lends(await lender.pass_once()) == [("lend", "n2")]


async def test_a_node_that_never_served_waits_the_whole_time_from_leadership() -> None:
    fleet = Fleet(view("n2"))
    fleet.policy = Policy(lend_idle_after=30 * MIN)
    lender = fleet.lender()
    fleet.now += 29 * MIN
    assert await lender.pass_once() == []
    lender.restart()  # a new leadership: what was seen before counts for nothing
    fleet.now += 29 * MIN
    assert await lender.pass_once() == []
    fleet.now += 1 * MIN
    done = await lender.pass_once()
    assert done[0].reason == (
        "n2: its cards served nothing since the keeper began watching 30 min ago (policy: 30 min)"
    )


async def test_a_starved_model_takes_back_the_lent_node_whose_jobs_end_first() -> None:
    soon, late = view("soon"), view("late")
    soon.slurm = SlurmStatus(version=1, jobs=[SlurmJob("41", end=WALL + 300)], steps=1)
    late.slurm = SlurmStatus(version=1, jobs=[SlurmJob("42", end=WALL + 3000)], steps=1)
    fleet = Fleet(view("n1", replicas=1), soon, late)
    fleet.stage.update(soon="lent", late="lent")
    fleet.policy = Policy(lend_idle_after=30 * MIN, reclaim_when_queued=60.0)
    lender = fleet.lender()
    fleet.backlogs = {"qwen": 59.0}
    assert await lender.pass_once() == []
    fleet.backlogs = {"qwen": 75.0}
    done = await lender.pass_once()
    assert done == [
        Decision(
            "reclaim",
            "soon",
            "soon: model qwen's requests have queued for 75 s (policy: 60 s); "
            "soon's 1 job end in 5 min",
        )
    ]
    # Still queued: the node on its way back counts for the model; no second one.
    assert lender.next == [
        "model qwen's requests have queued for 75 s (policy: 60 s): soon is being taken back for it"
    ]
    assert await lender.pass_once() == []
    # Back in llmgw, the model still waits: after reclaim_when_queued, the next one.
    fleet.stage["soon"] = "serving"
    assert await lender.pass_once() == []
    fleet.now += 59
    assert await lender.pass_once() == []
    fleet.now += 1
    assert lends(await lender.pass_once()) == [("reclaim", "late")]


async def test_a_node_just_back_from_slurm_is_not_lent_again_at_once() -> None:
    fleet = Fleet(view("n2"))
    fleet.stage["n2"] = "reclaiming"
    fleet.policy = Policy(lend_idle_after=30 * MIN, reclaim_when_queued=60.0)
    lender = fleet.lender()
    fleet.now += 86400
    assert await lender.pass_once() == []
    fleet.stage["n2"] = "serving"  # the keeper gave it back
    assert await lender.pass_once() == []
    fleet.now += 29 * MIN
    assert await lender.pass_once() == []
    fleet.now += 1 * MIN
    assert lends(await lender.pass_once()) == [("lend", "n2")]


async def test_a_replica_with_nowhere_to_go_takes_a_node_back() -> None:
    lent = view("n2")
    lent.slurm = SlurmStatus(version=1, jobs=[], steps=0)
    fleet = Fleet(view("n1", replicas=1), lent)
    fleet.stage["n2"] = "lent"
    fleet.policy = Policy(reclaim_when_queued=60.0)
    lender = fleet.lender()
    fleet.unplaced = {"llama": "no node fits (node cordoned: 1 node)"}
    assert lends(await lender.pass_once()) == [("reclaim", "n2")]
    assert fleet.acted[0].reason == (
        "n2: a replica of model llama has nowhere to go (no node fits (node cordoned: "
        "1 node)); n2 runs no job"
    )


async def test_a_refused_decision_is_said_and_tried_again() -> None:
    fleet = Fleet(view("n2"))
    fleet.policy = Policy(lend_idle_after=30 * MIN)
    lender = fleet.lender()
    fleet.now += 31 * MIN
    fleet.refuse = "n2 runs Slurm 21.08.8; upgrade it to 22.05 or newer"
    assert await lender.pass_once() == []
    assert lender.next == [
        "lend n2: its cards served nothing since the keeper began watching 31 min ago "
        "(policy: 30 min) (refused: n2 runs Slurm 21.08.8; upgrade it to 22.05 or newer)"
    ]
    fleet.refuse = None
    assert lends(await lender.pass_once()) == [("lend", "n2")]


async def test_a_node_not_ready_is_neither_lent_nor_counted() -> None:
    down = view("down", cards=4)
    down.state = NodeState.NOT_READY
    fleet = Fleet(down, view("n2", cards=2))
    fleet.policy = Policy(lend_idle_after=30 * MIN, keep_free_gpus=1)
    lender = fleet.lender()
    fleet.now += 86400
    assert await lender.pass_once() == []
    assert lender.next == [
        "n2 stays: lending its 2 cards would leave 0 with llmgw (policy: keep 1 free)"
    ]


async def test_a_node_an_operator_cordoned_is_not_lent() -> None:
    kept = view("n2")
    kept.cordoned = True
    fleet = Fleet(kept)
    fleet.policy = Policy(lend_idle_after=30 * MIN)
    lender = fleet.lender()
    fleet.now += 86400
    assert await lender.pass_once() == []
    kept.cordoned = False
    assert lends(await lender.pass_once()) == [("lend", "n2")]


def test_inputs_are_read_from_the_views() -> None:
    n2 = view("n2", cards=2, replicas=1)
    n2.slurm = SlurmStatus(version=1, jobs=None, steps=0)
    outside = view("x", cards=8)
    fleet = Fleet(n2, outside)
    del fleet.stage["x"]  # not one of Slurm's nodes
    lender = fleet.lender()
    fleet.now += 5
    nodes, models = lender.gather()
    by_id = {n.id: n for n in nodes}
    got = by_id["n2"]
    assert (got.in_set, got.stage, got.cards, got.replicas, got.idle) == (True, "serving", 2, 1, 0)
    assert (got.jobs, got.steps) == (None, 0)
    x = by_id["x"]
    assert (x.in_set, x.cards, x.idle, x.jobs, x.steps) == (False, 8, None, None, None)
    assert models == []
