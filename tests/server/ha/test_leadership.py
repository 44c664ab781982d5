"""Who leads, by the rules of ``llmgw.server.ha.leadership``: with PostgreSQL a lease in
the shared store (renewed by its holder, taken by another only once it expired, given up
by a holder that could not renew it in time); with SQLite an operator's ``promote`` and a
higher term seen on the link.

No sockets and no sleeping: the store, the lease table and the other control planes are
stand-ins, the clock is moved by the test (the lease keeper's too), and the leader's and
the standby's loops are counted, so each test waits for the count that proves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from llmgw import __version__
from llmgw.server.ha import lease as lease_module
from llmgw.server.ha.follower import LEADER_SETTING, TERM_SETTING
from llmgw.server.ha.joining import Admission
from llmgw.server.ha.leadership import WATCH, Hooks, Leadership, PromoteRefused
from llmgw.server.ha.lease import ROUND
from llmgw.server.ha.membership import Membership
from llmgw.server.ha.peerlink import NotLeading, PeerError
from llmgw.server.ha.seat import Seat
from llmgw.server.leader import Duty, LeaderWork
from llmgw.server.store import Audit, ServerRecord, StoreError

TTL = 10.0
SEATS = {
    name: Seat(name, f"10.0.0.{i}:8080", f"10.0.0.{i}:8443", f"10.0.0.{i}:8444", str(i))
    for i, name in enumerate(("cp-a", "cp-b"), start=1)
}


class Clock:
    """Wall and monotonic time at once, moved only by ``advance``."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass
class FakeLease:
    holder: str | None
    term: int
    expires_at: float
    now: float

    def held_by(self, name: str) -> bool:
        return self.holder == name and self.expires_at > self.now


class Tables:
    """What the store holds; with PostgreSQL one for every control plane."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.settings: dict[str, str] = {}
        self.servers = {
            s.name: ServerRecord(
                s.name, s.cert_serial, s.api_address, s.agent_address, s.peer_address, 0.0
            )
            for s in SEATS.values()
        }
        self.audits: list[tuple[str, str, str, str]] = []
        # The leader's lease (PostgreSQL's leader_lease row).
        self.holder: str | None = None
        self.term = 0
        self.expires_at = 0.0


class SQLiteLike:
    """A control plane's store without a lease (each has its own copy)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def _write(self) -> None:
        """Every write passes here (PostgreSQL checks the lease on it)."""

    async def get_setting(self, key: str) -> str | None:
        return self.tables.settings.get(key)

    async def put_setting(self, key: str, value: str) -> None:
        self._write()
        self.tables.settings[key] = value

    async def list_servers(self) -> list[ServerRecord]:
        return list(self.tables.servers.values())

    async def put_server(self, record: ServerRecord, audit: Audit) -> None:
        self._write()
        self.tables.servers[record.name] = record

    async def audit(self, actor: str, action: str, target: str, detail: str = "") -> None:
        self._write()
        self.tables.audits.append((actor, action, target, detail))


class PostgresLike(SQLiteLike):
    """One control plane's connection to the shared store: the lease as
    ``PostgresStore.take_lease`` keeps it, and writes fenced by the term."""

    def __init__(self, tables: Tables) -> None:
        super().__init__(tables)
        self.fence: tuple[str, int] | None = None
        # False: this control plane is cut off from the store.
        self.reachable = True
        self.asked = 0

    def _reach(self) -> None:
        if not self.reachable:
            raise StoreError("the store does not answer (cut off in this test)")

    def _write(self) -> None:
        self._reach()
        t = self.tables
        if self.fence is not None and (
            (t.holder, t.term) != self.fence or t.expires_at <= t.clock.time()
        ):
            raise StoreError(f"fenced: {self.fence} no longer holds the lease")

    async def take_lease(self, name: str, ttl: float) -> FakeLease:
        self._reach()
        self.asked += 1
        t = self.tables
        now = t.clock.time()
        if t.holder == name or t.holder is None or t.expires_at <= now:
            if not (t.holder == name and t.expires_at > now):
                t.term += 1  # a new holder, or an expired lease taken again
            t.holder, t.expires_at = name, now + ttl
        return FakeLease(t.holder, t.term, t.expires_at, now)

    async def release_lease(self, name: str) -> None:
        self._reach()
        if self.tables.holder == name:
            self.tables.expires_at = 0.0


class Peers:
    """The control planes' link: what each address answers to ``/peer/state``."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, Any]] = {}

    def leads(self, name: str, term: int) -> None:
        self.states[SEATS[name].peer_address] = {"name": name, "role": "leader", "term": term}

    async def json(self, method: str, address: str, path: str, **kw: Any) -> Any:
        state = self.states.get(address)
        if path != "/peer/state" or state is None:
            raise PeerError(f"{address} does not answer (in this test)")
        return dict(state)

    async def close(self) -> None:
        pass


class Loops:
    """The leader's duty and the standby's follower, counted while they run."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.moved = asyncio.Event()

    def loop(self, name: str) -> Callable[[asyncio.Event], Any]:
        async def run(stop: asyncio.Event) -> None:
            self.running[name] += 1
            self.moved.set()
            try:
                await stop.wait()
            finally:
                self.running[name] -= 1
                self.moved.set()

        return run

    async def settle(self, name: str, running: int) -> None:
        """Wait until exactly ``running`` loops called ``name`` run."""
        async with asyncio.timeout(5):
            while self.running[name] != running:
                self.moved.clear()
                await self.moved.wait()


class Recorded:
    """The hooks, each call kept."""

    def __init__(self) -> None:
        self.applied: list[set[str]] = []
        self.remembered: list[tuple[str, str | None]] = []
        self.stepped_down: list[str] = []
        self.follows = 0  # standby_duties: once each time following begins
        self.announced = 0
        self.demanded: list[tuple[str, bool]] = []
        self.signed_out: list[tuple[str, float, str]] = []
        self.elsewhere: list[dict[str, tuple[int, int]]] = []

    def hooks(self) -> Hooks:
        async def applied(tables: set[str]) -> None:
            self.applied.append(tables)

        async def usage(rows: list[tuple[str, str, str, str, int, int, int]]) -> None:
            pass

        async def audit(entries: list[Audit]) -> None:
            pass

        async def announce() -> None:
            self.announced += 1

        async def signed_out(sid: str, expires: float, actor: str) -> None:
            self.signed_out.append((sid, expires, actor))

        def standby_duties(ha: Leadership) -> list[Duty]:
            self.follows += 1
            return []

        return Hooks(
            applied=applied,
            followed=lambda fleet: None,
            fleet=list,
            demand=lambda model, start: self.demanded.append((model, start)),
            usage=usage,
            audit=audit,
            signed_out=signed_out,
            remember=lambda role, peer: self.remembered.append((role, peer)),
            standby_duties=standby_duties,
            announce=announce,
            stepped_down=self.stepped_down.append,
            key_counts=dict,
            elsewhere=self.elsewhere.append,
        )


@dataclasses.dataclass
class Plane:
    """One control plane under test, with what it did."""

    ha: Leadership
    store: Any
    hooks: Recorded
    loops: Loops


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    # The lease keeper reads ``time.monotonic`` for how long ago it renewed.
    monkeypatch.setattr(lease_module, "time", clock)
    return clock


@pytest.fixture
def tables(clock: Clock) -> Tables:
    return Tables(clock)


@pytest.fixture
def peers() -> Peers:
    return Peers()


@pytest.fixture
async def planes(clock: Clock, tables: Tables, peers: Peers) -> AsyncIterator[Callable[..., Plane]]:
    """Makes control planes; every one is stopped at the end."""
    made: list[Plane] = []

    def make(
        name: str, *, postgres: bool, role: str = "standby", leader: str | None = None
    ) -> Plane:
        loops = Loops()
        store: Any = PostgresLike(tables) if postgres else SQLiteLike(tables)
        hooks = Recorded()
        work = LeaderWork([Duty("lead", loops.loop("lead"))])
        ha = Leadership(
            store, SEATS[name], role, leader, peers, work, hooks.hooks(), TTL, clock=clock.time
        )
        # The follower's own rules are tested in test_follower.py; here only whether one
        # runs, and how many.
        follow = loops.loop("follow")
        ha.follower.run = follow  # type: ignore[method-assign]
        plane = Plane(ha, store, hooks, loops)
        made.append(plane)
        return plane

    yield make
    for plane in made:
        if isinstance(plane.store, PostgresLike):
            plane.store.reachable = True
        await plane.ha.stop()


# --- PostgreSQL: the lease ------------------------------------------------------------


async def test_a_leader_renews_its_lease_and_stays_leader(
    planes: Callable[..., Plane], clock: Clock, tables: Tables
) -> None:
    a = planes("cp-a", postgres=True)
    await a.ha.start()
    assert a.ha.leading and a.ha.term == 1
    assert a.store.fence == ("cp-a", 1)
    assert a.hooks.applied == [{"*"}]  # what is kept, read again before leading
    await a.loops.settle("lead", 1)
    await a.loops.settle("follow", 0)

    # Twice the lease's length in rounds: each renews it, none starts a new term.
    for _ in range(int(2 * TTL / ROUND)):
        clock.advance(ROUND)
        await a.ha.lease_round()
        assert a.ha.leading and a.ha.term == 1 and tables.term == 1
        assert tables.expires_at == clock.now + TTL
    assert a.store.asked == 1 + int(2 * TTL / ROUND)
    assert a.hooks.stepped_down == [] and a.loops.running["lead"] == 1
    assert a.ha.state()["role"] == "leader"
    await a.store.put_setting("written", "by the leader")  # its writes pass the fence


async def test_a_leader_that_cannot_renew_steps_down_before_its_lease_expires(
    planes: Callable[..., Plane], clock: Clock, tables: Tables
) -> None:
    a = planes("cp-a", postgres=True)
    b = planes("cp-b", postgres=True)
    await a.ha.start()
    await b.ha.start()
    await a.loops.settle("lead", 1)
    assert not b.ha.leading and b.ha.follower.leader == SEATS["cp-a"].peer_address

    a.store.reachable = False
    # It may lead on while no other can have taken the lease: up to TTL less two rounds.
    for _ in range(2):
        clock.advance(ROUND)
        await a.ha.lease_round()
        assert a.ha.leading and a.hooks.stepped_down == []
    clock.advance(ROUND)  # TTL - 2 * ROUND since the last renewal
    await a.ha.lease_round()
    assert not a.ha.leading
    assert a.hooks.stepped_down == [f"the lease could not be renewed for {TTL:g} s less two rounds"]
    assert a.loops.running["lead"] == 0  # its duties stopped before it returned
    assert a.store.fence is None
    await a.loops.settle("follow", 1)
    assert a.ha.state()["role"] == "standby"

    # It stopped before the lease ran out: the standby cannot have it yet...
    assert clock.now < tables.expires_at
    await b.ha.lease_round()
    assert not b.ha.leading and tables.holder == "cp-a"
    # ...and takes it, in a new term, once it expired.
    clock.advance(2 * ROUND)
    await b.ha.lease_round()
    assert b.ha.leading and b.ha.term == 2 and b.store.fence == ("cp-b", 2)


async def test_a_standby_takes_the_lease_only_once_it_expired(
    planes: Callable[..., Plane], clock: Clock, tables: Tables
) -> None:
    a = planes("cp-a", postgres=True)
    b = planes("cp-b", postgres=True)
    await a.ha.start()
    await b.ha.start()
    await b.loops.settle("follow", 1)
    assert b.hooks.follows == 1
    assert (b.ha.follower.leader_name, b.ha.follower.term) == ("cp-a", 1)
    assert b.ha.redirect() == SEATS["cp-a"].agent_address

    # cp-a stops answering at all (no more rounds of its own); its lease runs on.
    while clock.now + ROUND < tables.expires_at:
        clock.advance(ROUND)
        await b.ha.lease_round()
        assert not b.ha.leading and tables.holder == "cp-a" and tables.term == 1
    assert b.hooks.follows == 1  # following all along, never begun again

    clock.advance(ROUND)  # the lease has expired
    await b.ha.lease_round()
    assert b.ha.leading and b.ha.term == 2
    assert (tables.holder, tables.term) == ("cp-b", 2)
    assert b.store.fence == ("cp-b", 2)  # its writes, checked against the term
    assert b.hooks.applied == [{"*"}]
    await b.loops.settle("lead", 1)
    await b.loops.settle("follow", 0)
    assert b.ha.redirect() is None
    await b.store.put_setting("written", "by the new leader")


async def test_a_leader_that_stops_cleanly_gives_the_lease_up_at_once(
    planes: Callable[..., Plane], clock: Clock, tables: Tables
) -> None:
    a = planes("cp-a", postgres=True)
    b = planes("cp-b", postgres=True)
    await a.ha.start()
    await b.ha.start()
    await a.ha.stop()
    assert a.loops.running["lead"] == 0 and a.store.fence is None
    clock.advance(ROUND)  # one round, not the lease's length
    await b.ha.lease_round()
    assert b.ha.leading and b.ha.term == 2


async def test_an_old_leader_that_comes_back_learns_another_leads(
    planes: Callable[..., Plane], clock: Clock, tables: Tables
) -> None:
    a = planes("cp-a", postgres=True)
    b = planes("cp-b", postgres=True)
    await a.ha.start()
    await b.ha.start()
    await a.loops.settle("lead", 1)

    # cp-a stalls past its lease (no round of its own runs); cp-b takes it.
    clock.advance(TTL)
    await b.ha.lease_round()
    assert b.ha.leading and tables.term == 2

    with pytest.raises(StoreError, match="fenced"):
        await a.store.put_setting("late", "write")  # the old term's writes are refused
    await a.ha.lease_round()
    assert not a.ha.leading
    assert a.hooks.stepped_down == ["cp-b holds the leader's lease (term 2)"]
    assert a.loops.running["lead"] == 0 and a.store.fence is None
    assert a.ha.follower.leader == SEATS["cp-b"].peer_address
    assert (a.ha.follower.leader_name, a.ha.follower.term) == ("cp-b", 2)
    await a.loops.settle("follow", 1)
    assert a.ha.state()["leader"]["name"] == "cp-b"
    assert a.ha.redirect() == SEATS["cp-b"].agent_address


async def test_a_leader_whose_lapsed_lease_it_takes_again_leads_in_the_new_term(
    planes: Callable[..., Plane], clock: Clock, tables: Tables
) -> None:
    # The bug this found: a leader stalled past its lease and then renewed it got it back
    # in a new term (the store counts an expired lease taken again as one), but went on
    # with the old term's fence, so every write was refused while it still led.
    a = planes("cp-a", postgres=True)
    await a.ha.start()
    await a.loops.settle("lead", 1)
    tables.settings["changed"] = "while cp-a was stalled"  # another may have led

    clock.advance(TTL + ROUND)
    await a.ha.lease_round()
    assert (tables.holder, tables.term) == ("cp-a", 2)
    assert a.ha.leading and a.ha.term == 2
    assert a.store.fence == ("cp-a", 2)
    await a.store.put_setting("written", "after the stall")  # not fenced out
    assert a.hooks.applied == [{"*"}, {"*"}]  # the store read again for the new term
    assert a.hooks.stepped_down == []
    await a.loops.settle("lead", 1)


async def test_promote_is_refused_with_postgres(planes: Callable[..., Plane]) -> None:
    b = planes("cp-b", postgres=True)
    with pytest.raises(PromoteRefused, match="leadership moves by itself"):
        await b.ha.promote(force=True)


# --- SQLite: promote, and terms seen on the link --------------------------------------


async def test_a_standby_follows_until_it_is_promoted(
    planes: Callable[..., Plane], tables: Tables
) -> None:
    tables.settings[TERM_SETTING] = "3"
    b = planes("cp-b", postgres=False, leader=SEATS["cp-a"].peer_address)
    await b.ha.start()
    assert not b.ha.leading and b.ha.term == 3
    await b.loops.settle("follow", 1)
    assert b.loops.running["lead"] == 0

    # cp-a does not answer: promote goes ahead, a term above any seen.
    answer = await b.ha.promote(force=False)
    assert answer == {"name": "cp-b", "role": "leader", "term": 4}
    assert b.ha.leading
    assert tables.settings[TERM_SETTING] == "4" and tables.settings[LEADER_SETTING] == "cp-b"
    assert b.hooks.remembered == [("leader", None)]
    assert b.hooks.applied == [{"*"}]
    assert ("llmgw server promote", "server.promote", "cp-b", "term 4") in tables.audits
    await b.loops.settle("lead", 1)
    await b.loops.settle("follow", 0)
    with pytest.raises(PromoteRefused, match="already leads"):
        await b.ha.promote(force=False)


async def test_a_sign_out_sent_by_a_standby_is_kept_by_the_leader_alone(
    planes: Callable[..., Plane], tables: Tables
) -> None:
    tables.settings[TERM_SETTING] = "1"
    b = planes("cp-b", postgres=False, leader=SEATS["cp-a"].peer_address)
    await b.ha.start()
    with pytest.raises(NotLeading, match="cp-b is a standby"):
        await b.ha.sign_out("s1", 100.0, "admin@x via cp-c")
    assert b.hooks.signed_out == []
    await b.ha.promote(force=False)
    await b.ha.sign_out("s1", 100.0, "admin@x via cp-c")
    assert b.hooks.signed_out == [("s1", 100.0, "admin@x via cp-c")]


async def test_promote_is_refused_while_the_leader_answers_unless_forced(
    planes: Callable[..., Plane], tables: Tables, peers: Peers
) -> None:
    tables.settings[TERM_SETTING] = "1"
    peers.leads("cp-a", 1)
    b = planes("cp-b", postgres=False, leader=SEATS["cp-a"].peer_address)
    await b.ha.start()
    with pytest.raises(PromoteRefused, match="still answers as leader"):
        await b.ha.promote(force=False)
    assert not b.ha.leading and tables.settings[TERM_SETTING] == "1"
    await b.loops.settle("follow", 1)

    answer = await b.ha.promote(force=True)
    assert answer["term"] == 2 and b.ha.leading


async def test_a_leader_that_sees_a_higher_term_steps_down_and_follows(
    planes: Callable[..., Plane], tables: Tables, peers: Peers
) -> None:
    tables.settings[TERM_SETTING] = "1"
    a = planes("cp-a", postgres=False, role="leader")
    await a.ha.start()
    assert a.ha.leading and a.ha.term == 1
    await a.loops.settle("lead", 1)

    peers.leads("cp-b", 1)  # a leader of the same term is no reason to step down
    await a.ha.look()
    assert a.ha.leading and a.hooks.stepped_down == []

    peers.leads("cp-b", 2)  # promoted while cp-a was cut off
    await a.ha.look()
    assert not a.ha.leading
    assert a.hooks.stepped_down == ["cp-b leads with term 2, above this one's 1"]
    assert a.loops.running["lead"] == 0
    peer = SEATS["cp-b"].peer_address
    assert a.ha.follower.leader == peer
    assert a.hooks.remembered == [("standby", peer)]
    await a.loops.settle("follow", 1)


async def test_an_old_leader_started_again_follows_the_new_one_and_never_leads(
    planes: Callable[..., Plane], tables: Tables, peers: Peers
) -> None:
    # The bug this found: stepping down at start began following twice, so two followers
    # applied the leader's changes, and stop() ended only one of them.
    tables.settings[TERM_SETTING] = "1"
    peers.leads("cp-b", 2)
    a = planes("cp-a", postgres=False, role="leader")
    await a.ha.start()
    assert not a.ha.leading and a.ha.term == 1
    assert a.hooks.stepped_down == ["cp-b leads with term 2, above this one's 1"]
    assert a.hooks.follows == 1
    await a.loops.settle("follow", 1)
    assert a.loops.running["lead"] == 0
    assert tables.servers["cp-a"].joined_at == 0.0  # nothing written as leader
    await a.ha.stop()
    await a.loops.settle("follow", 0)


def members(plane: Plane) -> Membership:
    """The control planes as ``ctl servers`` lists them, from ``plane``'s leadership."""

    async def no_admission() -> Admission:
        raise AssertionError("listing asks nothing of a joiner's admission")

    return Membership(plane.ha, no_admission)


async def test_a_control_plane_that_stops_answering_is_listed_as_not_answering(
    planes: Callable[..., Plane], clock: Clock, tables: Tables, peers: Peers
) -> None:
    tables.settings[TERM_SETTING] = "1"
    a = planes("cp-a", postgres=False, role="leader")
    peers.states[SEATS["cp-b"].peer_address] = {"name": "cp-b", "role": "standby", "term": 1}
    await a.ha.start()
    listed = {s["name"]: s for s in members(a).listing()}
    assert listed["cp-b"]["answers"] and listed["cp-b"]["last_contact"] == clock.now
    assert listed["cp-a"]["this"] and listed["cp-a"]["role"] == "leader"
    assert members(a).counts() == {"total": 2, "answering": 2}
    # Each one's llmgw as it says it; one too old to say it is not guessed at.
    assert listed["cp-a"]["version"] == __version__ == a.ha.state()["version"]
    assert listed["cp-b"]["version"] is None
    peers.states[SEATS["cp-b"].peer_address]["version"] = "9.9.9"
    await a.ha.look()
    assert {s["name"]: s["version"] for s in members(a).listing()} == {
        "cp-a": __version__,
        "cp-b": "9.9.9",
    }

    del peers.states[SEATS["cp-b"].peer_address]
    clock.advance(3 * WATCH)
    await a.ha.look()  # no answer: what it said last stands, for three rounds
    assert {s["name"]: s["answers"] for s in members(a).listing()} == {"cp-a": True, "cp-b": True}
    clock.advance(0.1)
    listed = {s["name"]: s for s in members(a).listing()}
    assert not listed["cp-b"]["answers"] and listed["cp-b"]["role"] is None
    assert members(a).counts() == {"total": 2, "answering": 1}


async def test_a_control_plane_that_misses_a_round_is_counted_as_it_said_last_for_a_minute(
    planes: Callable[..., Plane], clock: Clock, tables: Tables, peers: Peers
) -> None:
    # A busy standby whose answer comes late must not let every limited key through
    # here at its whole limit again: its last minute's counts stand until they age out.
    tables.settings[TERM_SETTING] = "1"
    a = planes("cp-a", postgres=False, role="leader")
    address = SEATS["cp-b"].peer_address
    said = {"name": "cp-b", "role": "standby", "term": 1, "key_counts": {"k1": [30, 300]}}
    peers.states[address] = said
    await a.ha.start()
    await a.ha.look()
    assert a.hooks.elsewhere[-1] == {"k1": (30, 300)}
    del peers.states[address]
    clock.advance(3 * WATCH)
    await a.ha.look()
    assert a.hooks.elsewhere[-1] == {"k1": (30, 300)}
    peers.states[address] = {**said, "key_counts": {"k1": [31, 310], "k2": [1, 5]}}
    await a.ha.look()
    assert a.hooks.elsewhere[-1] == {"k1": (31, 310), "k2": (1, 5)}
    del peers.states[address]
    clock.advance(61)
    await a.ha.look()
    assert a.hooks.elsewhere[-1] == {}


async def test_the_leader_tells_the_agents_when_the_control_planes_change(
    planes: Callable[..., Plane], tables: Tables
) -> None:
    tables.settings[TERM_SETTING] = "1"
    a = planes("cp-a", postgres=False, role="leader")
    b = planes("cp-b", postgres=False, leader=SEATS["cp-a"].peer_address)
    await a.ha.start()
    await b.ha.start()
    assert a.ha.agent_addresses() == ["10.0.0.1:8443", "10.0.0.2:8443"]  # the leader's first
    await a.ha._round()  # one round of the watch, unchanged: nothing to say
    assert a.hooks.announced == 0

    tables.servers["cp-c"] = ServerRecord(
        "cp-c", "3", "10.0.0.3:8080", "10.0.0.3:8443", "10.0.0.3:8444", 0.0
    )
    await a.ha._round()
    await b.ha._round()
    assert a.hooks.announced == 1 and b.hooks.announced == 0  # a standby tells no one
    assert a.ha.agent_addresses()[-1] == "10.0.0.3:8443"
    await a.ha._round()
    assert a.hooks.announced == 1


def test_hooks_must_all_be_given() -> None:
    # No defaults: a control plane that forgets one fails at once, not on the day it
    # steps down.
    defaulted = [
        f.name
        for f in dataclasses.fields(Hooks)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert defaulted == []
    with pytest.raises(TypeError):
        Hooks()  # type: ignore[call-arg]


async def test_on_demand_requests_from_a_standby_reach_the_leaders_catalog_only(
    planes: Callable[..., Plane], tables: Tables
) -> None:
    tables.settings[TERM_SETTING] = "1"
    b = planes("cp-b", postgres=False, leader=SEATS["cp-a"].peer_address)
    await b.ha.start()
    # A standby places nothing: what it is sent is refused, naming the leader.
    with pytest.raises(NotLeading, match="cp-b is a standby"):
        b.ha.demand({"lazy": True}, "cp-c")
    assert b.hooks.demanded == []

    await b.ha.promote(force=False)
    b.ha.demand({"lazy": True, "warm": False}, "cp-c")
    assert b.hooks.demanded == [("lazy", True), ("warm", False)]
