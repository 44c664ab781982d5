"""What the reconciler keeps of each replica and says after a pass: the tracks (a
replica, and for one spanning nodes its workers), each profile's failures, the starts
and stops of a plan, and what ``ctl models`` shows of a profile. Plain data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from llmgw.server.fleet.nodeview import NodeView
from llmgw.wire.messages import ShardStatus
from llmgw.wire.states import ShardState

LIVE = frozenset(ShardState) - {ShardState.FAILED, ShardState.STOPPED}
# A node that has not reported a replica it was asked to start this long has lost it.
REPORT_TIMEOUT = 60.0
# Failures this recent make placement pass a node over.
AVOID_FOR = 600.0
# A profile that stays short has its nodes judged again this often, for its note.
REJUDGE = 30.0
# A stop unanswered this long is sent again.
STOP_RESEND = 30.0


@dataclass
class Member:
    """One worker (rank 1..) of a replica spanning nodes."""

    rank: int
    node: str
    port: int | None = None
    cards: tuple[str, ...] = ()
    state: ShardState = ShardState.PENDING
    reason: str = ""
    sent_at: float | None = None


@dataclass
class Track:
    """One replica as the reconciler knows it; for one spanning nodes, its leader's
    shard (rank 0) with its workers beside it."""

    replica_id: str
    model: str
    profile: str
    node: str
    fingerprint: str | None
    state: ShardState
    moved_at: float
    port: int | None = None
    cards: tuple[str, ...] = ()
    sent_at: float | None = None  # set while no agent has reported it
    progress: int | None = None
    stop_sent: float | None = None
    stop_reason: str = ""
    failure_counted: bool = False
    reason: str = ""
    workers: list[Member] = field(default_factory=list)
    # The leader's port the engines meet at (vLLM, SGLang), and whether every card is
    # in one NVLink domain.
    rendezvous_port: int | None = None
    nvlink: bool = False

    def worker(self, rank: int) -> Member | None:
        return next((w for w in self.workers if w.rank == rank), None)

    @property
    def nodes(self) -> list[str]:
        return [self.node, *(w.node for w in self.workers)]

    def broken(self) -> str | None:
        """Why a worker brings the whole replica down; None while none does."""
        for w in self.workers:
            if w.state == ShardState.FAILED:
                return f"rank {w.rank} on {w.node} failed: {w.reason or 'no reason given'}"
        return None


@dataclass
class Health:
    """A profile's failures: the backoff and the nodes to pass over."""

    consecutive: int = 0
    last_at: float = 0.0
    last_reason: str = ""
    next_try: float = 0.0
    nodes: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StartMember:
    rank: int
    node: str
    port: int
    cards: tuple[str, ...]


@dataclass(frozen=True)
class Start:
    replica_id: str
    model: str
    profile: str
    node: str
    port: int
    cards: tuple[str, ...]
    workers: tuple[StartMember, ...] = ()
    rendezvous_port: int | None = None
    nvlink: bool = False


@dataclass(frozen=True)
class Stop:
    replica_id: str
    node: str
    reason: str


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    # (model, reason): on-demand models to park.
    parks: list[tuple[str, str]] = field(default_factory=list)


class StatusJson(TypedDict):
    desired: int
    ready: int
    starting: int
    stale: int
    replacing: int
    note: str


@dataclass
class ProfileStatus:
    """What ``ctl models`` shows of a profile after a pass."""

    desired: int = 0
    ready: int = 0
    starting: int = 0
    stale: int = 0
    replacing: int = 0
    note: str = ""

    def as_json(self) -> StatusJson:
        return {
            "desired": self.desired,
            "ready": self.ready,
            "starting": self.starting,
            "stale": self.stale,
            "replacing": self.replacing,
            "note": self.note,
        }


def download_done(view: NodeView, replica_id: str) -> int | None:
    for progress in view.downloads.values():
        if replica_id in progress.get("replica_ids", []):
            done = progress.get("done")
            return int(done) if done is not None else None
    return None


def replica_progress(track: Track, nodes: Mapping[str, NodeView]) -> int | None:
    """Bytes fetched so far for a replica, as its nodes report them: its own shard's
    download and, for one spanning nodes, each worker's (a worker still fetching its
    weights is progress of the replica while its leader waits); None while none is
    reported."""
    shares = [(track.node, track.replica_id)]
    shares += [(w.node, f"{track.replica_id}~{w.rank}") for w in track.workers]
    found = [
        done
        for node, sid in shares
        if (view := nodes.get(node)) is not None and (done := download_done(view, sid)) is not None
    ]
    return sum(found) if found else None


def stop_order(tracks: Sequence[Track]) -> list[Track]:
    """Which to stop first: not ready before ready, newest before oldest, then by id."""
    return sorted(tracks, key=lambda t: (t.state == ShardState.READY, -t.moved_at, t.replica_id))


def merge_workers(
    tracks: Mapping[str, Track], workers: Iterable[tuple[str, str, int, ShardStatus]]
) -> tuple[set[str], dict[str, str]]:
    """Merge the workers' reports (node, shard id, rank, status) into their replicas'
    tracks: (the shard ids merged, the orphans by shard id with their node). A worker
    whose replica is gone, or that has another worker at its rank, is an orphan, to be
    stopped. After a control plane restart the groups are rebuilt from these reports."""
    orphans: dict[str, str] = {}
    reported: set[str] = set()
    for node, sid, rank, shard in workers:
        track = tracks.get(sid.rsplit("~", 1)[0])
        member = track.worker(rank) if track is not None else None
        if track is not None and member is None and track.stop_sent is None:
            member = Member(rank, node, shard.port)
            track.workers.append(member)
            track.workers.sort(key=lambda w: w.rank)
        if track is None or member is None or member.node != node:
            if shard.state in LIVE:
                orphans[sid] = node
            continue
        reported.add(sid)
        member.sent_at = None
        member.state, member.reason = shard.state, shard.reason
        member.port = shard.port or member.port
        member.cards = tuple(shard.cards) or member.cards
    return reported, orphans


def unreported_workers(
    track: Track, reported: set[str], nodes: Mapping[str, NodeView], now: float
) -> None:
    """A worker not reported is failed once its node, connected, no longer runs it, or
    never said it started it."""
    if track.stop_sent is not None:
        return
    for w in track.workers:
        if f"{track.replica_id}~{w.rank}" in reported:
            continue
        home = nodes.get(w.node)
        if w.sent_at is not None:
            if now - w.sent_at > REPORT_TIMEOUT:
                w.state, w.reason = ShardState.FAILED, "its node never reported starting it"
        elif home is None or home.session is not None:
            w.state, w.reason = ShardState.FAILED, "it is gone from its node"


class ReplicaNote(TypedDict):
    """What the catalog says of one replica in the replicas listing: its model and
    profile (None for a shard started by hand or one it cannot name), whether it runs
    another version of its profile, and why it is as it is."""

    model: str | None
    profile: str | None
    stale: bool
    note: str
