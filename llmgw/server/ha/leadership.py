"""Who leads: this control plane's role and term, the switch between leading and
following, and what the control planes' link serves.

With SQLite there is no quorum, so leadership moves only by an operator's act:
``llmgw server promote`` on a standby makes it lead with a higher term. Every control
plane asks the others for their state every two seconds; one that leads and finds
another leading with a higher term steps down and follows it, and a control plane that
starts as leader does the same before it leads, so an old leader started again never
writes. Standbys refuse to follow a leader whose term is below their store's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from llmgw import __version__
from llmgw.jsonvalue import JSON, JSONObject, as_int
from llmgw.server.audittrail import entries_from_json
from llmgw.server.gateway.limits import UsageRows, usage_rows
from llmgw.server.ha import sqlitesync
from llmgw.server.ha.follower import LEADER_SETTING, TERM_SETTING, Follower, store_term
from llmgw.server.ha.keycounts import PeerCounts
from llmgw.server.ha.lease import ROUND as LEASE_ROUND
from llmgw.server.ha.lease import Lease, LeaseKeeper, LeaseStore
from llmgw.server.ha.peerlink import (
    Behind,
    ChangesAnswer,
    LeaderInfo,
    NotLeading,
    PeerClient,
    PeerError,
    PeerState,
    PromoteAnswer,
    Refused,
    Role,
)
from llmgw.server.ha.seat import Seat
from llmgw.server.leader import Duty, LeaderWork
from llmgw.server.store import Audit, ServerRecord, SQLiteStore, Store

log = logging.getLogger("llmgw.ha")

# How often every control plane asks the others how they stand.
WATCH = 2.0
# How often the store's change log is trimmed (a standby's too: applying writes its own).
PRUNE_EVERY = 60.0


class PromoteRefused(Refused):
    """``server promote`` would make two leaders, or has nothing to do: in words."""


@dataclass
class Hooks:
    """What the control plane around this does when the role or the followed state moves."""

    # The store changed under a standby (table names; "*" for all): reload what is kept.
    applied: Callable[[set[str]], Awaitable[None]]
    # The leader's fleet, as /peer/fleet gives it.
    followed: Callable[[list[JSONObject]], None]
    # The fleet as this leader sees it, for standbys.
    fleet: Callable[[], list[dict[str, object]]]
    # An on-demand model a standby was asked for (``start``: started if at zero).
    demand: Callable[[str, bool], None]
    # Usage rows and audit entries from a standby, for the store.
    usage: Callable[[UsageRows], Awaitable[None]]
    audit: Callable[[list[Audit]], Awaitable[None]]
    # An admin page session signed out on a standby (id, when it ends, who), for the store.
    signed_out: Callable[[str, float, str], Awaitable[None]]
    # The role in server.yaml: ("leader", None) or ("standby", leader's peer address).
    remember: Callable[[str, str | None], None]
    # Duties a standby runs besides following (shipping its usage to the leader).
    standby_duties: Callable[[Leadership], list[Duty]]
    # The control planes changed: tell the agents (a leader's).
    announce: Callable[[], Awaitable[None]]
    # Leading ended here: agents' streams go, so they come back to the leader.
    stepped_down: Callable[[str], None]
    # Each limited key's last minute here; and the others' sums, for the limiter.
    key_counts: Callable[[], dict[str, list[int]]]
    elsewhere: Callable[[dict[str, tuple[int, int]]], None]


class Leadership:
    def __init__(
        self,
        store: Store,
        seat: Seat,
        role: str,
        leader: str | None,
        client: PeerClient,
        work: LeaderWork,
        hooks: Hooks,
        lease_seconds: float = 10.0,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        # The wall clock: when the others last answered, and this one's row. Handed in,
        # so tests move it instead of sleeping.
        self.clock = clock
        self.seat = seat
        self.name = seat.name
        self.started = clock()  # this process's start, as /peer/state says it
        self.term = 0
        self.client = client
        self.work = work
        self.hooks = hooks
        # PostgreSQL (shared by every control plane): leadership is a lease in it, and a
        # standby reads the store itself. SQLite: each has its own copy, shipped.
        self.lease: LeaseKeeper | None = None
        if hasattr(store, "take_lease"):
            self.lease = LeaseKeeper(cast(LeaseStore, store), seat.name, lease_seconds)
            role = "standby"  # until the lease says otherwise
        self.role: Role = "leader" if role == "leader" else "standby"
        self.follower = Follower(
            store,
            client,
            leader or "",
            hooks.applied,
            hooks.followed,
            self._moved,
            ships=self.lease is None,
        )
        self.standby_work: LeaderWork | None = None
        # What the other control planes said last: name -> (when, their state).
        self.seen: dict[str, tuple[float, JSONObject]] = {}
        # The other control planes' last minute of each limited key (``keycounts``).
        self.counted = PeerCounts()
        self.servers: dict[str, ServerRecord] = {}
        # The control planes agents were last told of (Registered).
        self._announced: list[str] = []
        # A read of the control planes still under way (the store may be out of reach).
        self._loading: asyncio.Task[None] | None = None

    @property
    def leading(self) -> bool:
        return self.role == "leader"

    # ------------------------------------------------------------------ the switch

    @property
    def sqlite(self) -> SQLiteStore:
        return cast(SQLiteStore, self.store)

    async def start(self) -> None:
        """Take this control plane's role: lead, unless another leads with a higher term
        (with PostgreSQL: lead when the lease is free)."""
        await self._load_servers()
        if self.lease is not None:
            await self.lease_round()
            return
        self.term = await store_term(self.sqlite)
        if self.leading:
            # Before anything is written: an old leader started again learns here that
            # another leads now, and follows it instead.
            await self.look()
        if self.leading:
            if self.term == 0:  # a store from before standbys: its first term
                self.term = 1
                await self._write_term()
            await self._enter()
            self._announced = self.agent_addresses()
            self.work.lead()
        else:
            self._follow()

    async def stop(self) -> None:
        leading = self.leading
        await self.work.step_down()
        if self.lease is not None and leading:
            await self.lease.release()
        if self.standby_work is not None:
            await self.standby_work.step_down()
            self.standby_work = None
        await self.client.close()

    async def _enter(self) -> None:
        """A leader's own row, so standbys and agents learn where it is."""
        mine = self.servers.get(self.name)
        seat = self.seat
        here = (seat.api_address, seat.agent_address, seat.peer_address, seat.cert_serial)
        if (
            mine is None
            or (
                mine.api_address,
                mine.agent_address,
                mine.peer_address,
                mine.cert_serial,
            )
            != here
        ):
            record = ServerRecord(
                self.name,
                seat.cert_serial,
                seat.api_address,
                seat.agent_address,
                seat.peer_address,
                self.clock(),
            )
            await self.store.put_server(record, Audit("llmgw", "server.seat", self.name))
            await self._load_servers()

    def _follow(self) -> None:
        if self.standby_work is not None:
            # Following already (a step down at start begins it before start would): a
            # second follower would apply every change twice, and outlive stop().
            return
        self.standby_work = LeaderWork(
            [Duty("follow", self.follower.run), *self.hooks.standby_duties(self)],
            label="standby",
        )
        self.standby_work.lead()

    def _moved(self, peer: str) -> None:
        self.hooks.remember("standby", peer)

    async def step_down(self, leader_peer: str, why: str) -> None:
        """Stop leading and follow ``leader_peer``."""
        if not self.leading:
            return
        log.warning("stepping down: %s; following %s", why, leader_peer)
        self.role = "standby"
        await self.work.step_down()
        self.hooks.stepped_down(why)
        self.follower.leader = leader_peer
        self.hooks.remember("standby", leader_peer)
        self._follow()

    async def promote(self, force: bool) -> PromoteAnswer:
        """Lead from now on, with a term above any this control plane has seen."""
        if self.lease is not None:
            raise PromoteRefused(
                "the store is PostgreSQL: leadership moves by itself (the leader's lease); "
                "stop the leader and another takes over within ha.lease_seconds"
            )
        if self.leading:
            raise PromoteRefused(f"{self.name} already leads (term {self.term})")
        old = self.follower.leader_name or "the leader"
        if self.follower.leader:
            with contextlib.suppress(PeerError):
                answer = await self.client.json(
                    "GET", self.follower.leader, "/peer/state", timeout=3
                )
                state = answer if isinstance(answer, dict) else {}
                if state.get("role") == "leader" and not force:
                    raise PromoteRefused(
                        f"{state.get('name', old)} at {self.follower.leader} still answers as "
                        f"leader (term {state.get('term')}): stop it first, or promote with "
                        "--force to take over anyway"
                    )
        if self.standby_work is not None:
            await self.standby_work.step_down()
            self.standby_work = None
        self.term = max(self.term, self.follower.term, await store_term(self.sqlite)) + 1
        self.role = "leader"
        await self._write_term()
        await self.store.audit(
            "llmgw server promote", "server.promote", self.name, f"term {self.term}"
        )
        await self._load_servers()
        await self._enter()
        self.hooks.remember("leader", None)
        await self.hooks.applied({"*"})
        self.work.lead()
        log.warning("promoted: %s leads with term %d (was %s's standby)", self.name, self.term, old)
        return {"name": self.name, "role": "leader", "term": self.term}

    async def lease_round(self) -> None:
        """Ask for the leader's lease; lead when it is ours, stop when it is not."""
        assert self.lease is not None
        lease = await self.lease.round()
        if lease is not None and lease.held_by(self.name):
            if self.leading and lease.term != self.term:
                # Ours again, in a new term: it lapsed while this process stalled, and
                # another may have led and written meanwhile. The old term's fence would
                # refuse every write, so lead anew, from the store as it is now.
                log.warning(
                    "the leader's lease lapsed and was taken again (term %d, was %d)",
                    lease.term,
                    self.term,
                )
                self.role = "standby"
                await self.work.step_down()
            if not self.leading:
                await self._take_lease(lease)
            return
        if self.leading and (lease is not None or not self.lease.held()):
            why = (
                f"{lease.holder} holds the leader's lease (term {lease.term})"
                if lease is not None
                else f"the lease could not be renewed for {self.lease.ttl:g} s less two rounds"
            )
            await self._lose_lease(why)
        if lease is not None:
            self._heed(lease)
        if not self.leading and self.standby_work is None:
            self._follow()

    def _heed(self, lease: Lease) -> None:
        """Follow the lease's holder, where it is."""
        self.follower.leader_name, self.follower.term = lease.holder, lease.term
        holder = self.servers.get(lease.holder or "")
        if holder is not None:
            self.follower.leader = holder.peer_address

    async def _take_lease(self, lease: Lease) -> None:
        assert self.lease is not None
        if self.standby_work is not None:
            await self.standby_work.step_down()
            self.standby_work = None
        self.term = lease.term
        self.lease.fence(lease.term)
        self.role = "leader"
        await self.hooks.applied({"*"})
        await self._enter()
        self._announced = self.agent_addresses()
        self.work.lead()
        log.warning("%s holds the leader's lease: leading, term %d", self.name, self.term)

    async def _lose_lease(self, why: str) -> None:
        assert self.lease is not None
        log.warning("stepping down: %s", why)
        self.role = "standby"
        await self.work.step_down()
        self.lease.fence(None)
        self.hooks.stepped_down(why)

    async def _write_term(self) -> None:
        await self.store.put_setting(TERM_SETTING, str(self.term))
        await self.store.put_setting(LEADER_SETTING, self.name)

    # ------------------------------------------------------------------ watching

    async def reload_servers(self) -> None:
        await self._load_servers()

    async def _load_servers(self) -> None:
        self.servers = {s.name: s for s in await self.store.list_servers()}

    async def watch(self, stop: asyncio.Event) -> None:
        """Ask the others how they stand, every two seconds, until ``stop``; trim the
        change log every minute."""
        lease = asyncio.create_task(self._keep_lease(stop)) if self.lease else None
        try:
            await self._watch(stop)
        finally:
            if lease is not None:
                await lease

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        """A round for the lease every ROUND seconds, on its own: nothing else the
        watch does (reading the store, asking the others) may hold it up."""
        while not stop.is_set():
            try:
                await self.lease_round()
            except Exception:
                log.exception("the lease round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=LEASE_ROUND)

    async def _watch(self, stop: asyncio.Event) -> None:
        now = time.monotonic
        pruned = begun = now()
        while not stop.is_set():
            if self.lease is None and time.monotonic() - pruned >= PRUNE_EVERY:
                pruned = time.monotonic()
                try:
                    gone = await sqlitesync.prune(self.sqlite)
                    if gone:
                        log.info("change log: %d changes no standby needs any more", gone)
                except Exception as exc:
                    log.warning("could not trim the change log: %s", exc)
            # A round every WATCH seconds from the start of the last, however long that
            # took (on busy cores, seconds): the keys' counts are never older than that.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, begun + WATCH - now()))
            begun = now()
            try:
                # Bounded: a store that stopped answering must not hold the watch.
                await asyncio.wait_for(self._round(), timeout=3 * WATCH)
            except TimeoutError:
                log.warning("the control planes' round took over %g s: skipped", 3 * WATCH)
            except Exception:
                log.exception("asking the other control planes failed")

    async def _round(self) -> None:
        await self.look()  # over the control planes' link alone
        if self._loading is None:
            self._loading = asyncio.create_task(self._load_servers())
        loading = self._loading
        done, _ = await asyncio.wait({loading}, timeout=WATCH)
        if not done:
            return  # a store out of reach: the list as it was, asked again next round
        self._loading = None
        loading.result()
        planes = self.agent_addresses()
        if self.leading and planes != self._announced:
            await self.hooks.announce()
        self._announced = planes

    async def look(self) -> None:
        others = [s for s in self.servers.values() if s.name != self.name and s.removed_at is None]
        answers = await asyncio.gather(
            *(self.client.json("GET", s.peer_address, "/peer/state", timeout=2) for s in others),
            return_exceptions=True,
        )
        now = self.clock()
        for server, answer in zip(others, answers, strict=True):
            if isinstance(answer, dict):
                self.counted.heard(server.name, answer.pop("key_counts", None), now)
                self.seen[server.name] = (now, answer)
        # One that did not answer this round counts as it said last, for a minute.
        self.hooks.elsewhere(self.counted.summed((s.name for s in others), now))
        if not self.leading:
            if self.lease is not None:
                # The store may be out of reach here: the one that says it leads, with
                # the highest term, is whom writes and agents are sent to meanwhile.
                for server, answer in zip(others, answers, strict=True):
                    if (
                        isinstance(answer, dict)
                        and answer.get("role") == "leader"
                        and as_int(answer.get("term", 0)) >= self.follower.term
                    ):
                        self.follower.leader_name = server.name
                        self.follower.term = as_int(answer["term"])
                        self.follower.leader = server.peer_address
            if self.standby_work is None:
                self._follow()
            return
        if self.lease is not None:
            return  # the lease decides, not what others say
        for server, answer in zip(others, answers, strict=True):
            if (
                isinstance(answer, dict)
                and answer.get("role") == "leader"
                and as_int(answer.get("term", 0)) > self.term
            ):
                await self.step_down(
                    server.peer_address,
                    f"{server.name} leads with term {answer['term']}, above this one's {self.term}",
                )
                return

    # ------------------------------------------------------------------ what is said

    def leader_record(self) -> ServerRecord | None:
        name = self.name if self.leading else self.follower.leader_name
        return self.servers.get(name) if name else None

    def state(self) -> PeerState:
        """``/leader`` and ``/peer/state``: this control plane, its role, who leads."""
        leader = self.leader_record()
        if self.leading:
            info: LeaderInfo | None = {
                "name": self.name,
                "api_address": self.seat.api_address,
                "agent_address": self.seat.agent_address,
                "peer_address": self.seat.peer_address,
            }
        elif leader is not None:
            info = {
                "name": leader.name,
                "api_address": leader.api_address,
                "agent_address": leader.agent_address,
                "peer_address": self.follower.leader or leader.peer_address,
            }
        elif self.follower.leader:
            info = {"name": None, "peer_address": self.follower.leader}
        else:
            info = None
        follower = self.follower
        return {
            "name": self.name,
            "role": self.role,
            "term": self.term if self.leading else follower.term,
            "leader": info,
            "problem": None if self.leading else (follower.problem or None),
            "lag_seconds": None if self.leading else follower.lag(),
            "last_contact": None if self.leading else follower.last_contact,
            "version": __version__,
            "started": self.started,
        }

    def agent_addresses(self) -> list[str]:
        """Every control plane's agents' port, the leader's first (for Registered)."""
        leader = self.leader_record()
        out = [leader.agent_address] if leader else []
        for s in self.servers.values():
            if s.removed_at is None and s.agent_address not in out:
                out.append(s.agent_address)
        return out

    def redirect(self) -> str | None:
        """None while leading (agents are taken); a standby sends them to the leader's
        agents' port, or away ("") when it knows no leader."""
        if self.leading:
            return None
        leader = self.leader_record()
        return leader.agent_address if leader and leader.name != self.name else ""

    # ------------------------------------------------------------------ the link

    def key_counts(self) -> dict[str, list[int]]:
        return self.hooks.key_counts()

    def peer_ok(self, name: str, serial: int) -> bool:
        record = self.servers.get(name)
        return (
            record is not None and record.removed_at is None and record.cert_serial == str(serial)
        )

    async def snapshot(self, dest: Path) -> int:
        if not self.leading:
            raise NotLeading(self._not_leading())
        self._shipped()
        return await sqlitesync.snapshot(self.sqlite, dest)

    def _shipped(self) -> None:
        if self.lease is not None:
            raise Refused("the store is PostgreSQL: every control plane reads it itself")

    async def changes(self, after: int, wait: float) -> ChangesAnswer:
        if not self.leading:
            raise NotLeading(self._not_leading())
        self._shipped()
        deadline = time.monotonic() + wait
        while True:
            try:
                changes = await sqlitesync.changes_after(self.sqlite, after)
            except sqlitesync.TooFarBehind as exc:
                raise Behind(str(exc)) from None
            if changes or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        return {
            "term": self.term,
            "leader": self.name,
            "seq": await sqlitesync.latest_seq(self.sqlite),
            "changes": [c.as_json() for c in changes],
        }

    def fleet(self) -> list[dict[str, object]]:
        if not self.leading:
            raise NotLeading(self._not_leading())
        return self.hooks.fleet()

    async def usage(self, rows: list[list[JSON]], sender: str) -> None:
        if not self.leading:
            raise NotLeading(self._not_leading())
        await self.hooks.usage(usage_rows(rows))

    async def audit(self, rows: list[JSON], sender: str) -> None:
        """A standby's audit entries (tool calls, guard decisions), for the store."""
        if not self.leading:
            raise NotLeading(self._not_leading())
        await self.hooks.audit(entries_from_json(rows))

    def demand(self, models: dict[str, bool], sender: str) -> None:
        """On-demand models a standby was asked for: the catalog starts or keeps them."""
        if not self.leading:
            raise NotLeading(self._not_leading())
        for model, start in models.items():
            log.debug("%s asks for on-demand model %s (start: %s)", sender, model, start)
            self.hooks.demand(model, start)

    async def sign_out(self, sid: str, expires: float, actor: str) -> None:
        if not self.leading:
            raise NotLeading(self._not_leading())
        await self.hooks.signed_out(sid, expires, actor)

    def _not_leading(self) -> str:
        leader = self.leader_record()
        where = f"{leader.name} at {leader.peer_address}" if leader else "unknown"
        return f"{self.name} is a standby; the leader is {where}"
