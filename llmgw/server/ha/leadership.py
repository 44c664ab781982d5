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
from typing import Any

from llmgw.server.ha import sqlitesync
from llmgw.server.ha.follower import LEADER_SETTING, TERM_SETTING, Follower, store_term
from llmgw.server.ha.peerlink import Behind, NotLeading, PeerClient, PeerError, Refused
from llmgw.server.leader import Duty, LeaderWork
from llmgw.server.store import Audit, ServerRecord, SQLiteStore

log = logging.getLogger("llmgw.ha")

# How often every control plane asks the others how they stand.
WATCH = 2.0
# How often the store's change log is trimmed (a standby's too: applying writes its own).
PRUNE_EVERY = 60.0


@dataclass(frozen=True)
class Seat:
    """This control plane: its name and where it answers."""

    name: str
    api_address: str
    agent_address: str
    peer_address: str
    # Its certificate on the control planes' link.
    cert_serial: str


class PromoteRefused(Refused):
    """``server promote`` would make two leaders, or has nothing to do: in words."""


@dataclass
class Hooks:
    """What the control plane around this does when the role or the followed state moves."""

    # The store changed under a standby (table names; "*" for all): reload what is kept.
    applied: Callable[[set[str]], Awaitable[None]]
    # The leader's fleet, as /peer/fleet gives it.
    followed: Callable[[list[dict[str, Any]]], None]
    # The fleet as this leader sees it, for standbys.
    fleet: Callable[[], list[dict[str, Any]]]
    # Usage rows from a standby, for the store.
    usage: Callable[[list[tuple[str, str, str, str, int, int, int]]], Awaitable[None]]
    # The role in server.yaml: ("leader", None) or ("standby", leader's peer address).
    remember: Callable[[str, str | None], None]
    # Duties a standby runs besides following (shipping its usage to the leader).
    standby_duties: Callable[[Leadership], list[Duty]]
    # The control planes changed: tell the agents (a leader's).
    announce: Callable[[], Awaitable[None]] | None = None
    # Each limited key's last minute here; and the others' sums, for the limiter.
    key_counts: Callable[[], dict[str, list[int]]] = dict
    elsewhere: Callable[[dict[str, tuple[int, int]]], None] = lambda counts: None


class Leadership:
    def __init__(
        self,
        store: SQLiteStore,
        seat: Seat,
        role: str,
        leader: str | None,
        client: PeerClient,
        work: LeaderWork,
        hooks: Hooks,
    ) -> None:
        self.store = store
        self.seat = seat
        self.name = seat.name
        self.role = role
        self.term = 0
        self.client = client
        self.work = work
        self.hooks = hooks
        self.follower = Follower(
            store, client, leader or "", hooks.applied, hooks.followed, self._moved
        )
        self.standby_work: LeaderWork | None = None
        # What the other control planes said last: name -> (when, their state).
        self.seen: dict[str, tuple[float, dict[str, Any]]] = {}
        self.servers: dict[str, ServerRecord] = {}
        # The control planes agents were last told of (Registered).
        self._announced: list[str] = []

    @property
    def leading(self) -> bool:
        return self.role == "leader"

    # ------------------------------------------------------------------ the switch

    async def start(self) -> None:
        """Take this control plane's role: lead, unless another leads with a higher term."""
        self.term = await store_term(self.store)
        await self._load_servers()
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
        await self.work.step_down()
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
                time.time(),
            )
            await self.store.put_server(record, Audit("llmgw", "server.seat", self.name))
            await self._load_servers()

    def _follow(self) -> None:
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
        self.follower.leader = leader_peer
        self.hooks.remember("standby", leader_peer)
        self._follow()

    async def promote(self, force: bool) -> dict[str, Any]:
        """Lead from now on, with a term above any this control plane has seen."""
        if self.leading:
            raise PromoteRefused(f"{self.name} already leads (term {self.term})")
        old = self.follower.leader_name or "the leader"
        if self.follower.leader:
            with contextlib.suppress(PeerError):
                state = await self.client.json(
                    "GET", self.follower.leader, "/peer/state", timeout=3
                )
                if state.get("role") == "leader" and not force:
                    raise PromoteRefused(
                        f"{state.get('name', old)} at {self.follower.leader} still answers as "
                        f"leader (term {state.get('term')}): stop it first, or promote with "
                        "--force to take over anyway"
                    )
        if self.standby_work is not None:
            await self.standby_work.step_down()
            self.standby_work = None
        self.term = max(self.term, self.follower.term, await store_term(self.store)) + 1
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
        pruned = time.monotonic()
        while not stop.is_set():
            if time.monotonic() - pruned >= PRUNE_EVERY:
                pruned = time.monotonic()
                try:
                    gone = await sqlitesync.prune(self.store)
                    if gone:
                        log.info("change log: %d changes no standby needs any more", gone)
                except Exception as exc:
                    log.warning("could not trim the change log: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=WATCH)
            try:
                await self._load_servers()
                planes = self.agent_addresses()
                if self.leading and planes != self._announced and self.hooks.announce:
                    await self.hooks.announce()
                self._announced = planes
                await self.look()
            except Exception:
                log.exception("asking the other control planes failed")

    async def look(self) -> None:
        others = [s for s in self.servers.values() if s.name != self.name and s.removed_at is None]
        answers = await asyncio.gather(
            *(self.client.json("GET", s.peer_address, "/peer/state", timeout=2) for s in others),
            return_exceptions=True,
        )
        now = time.time()
        elsewhere: dict[str, tuple[int, int]] = {}
        for server, answer in zip(others, answers, strict=True):
            if isinstance(answer, dict):
                counts = answer.pop("key_counts", None) or {}
                self.seen[server.name] = (now, answer)
                for key_id, (requests, tokens) in counts.items():
                    r, t = elsewhere.get(key_id, (0, 0))
                    elsewhere[key_id] = (r + int(requests), t + int(tokens))
        self.hooks.elsewhere(elsewhere)
        if not self.leading:
            if self.standby_work is None:
                self._follow()
            return
        for server, answer in zip(others, answers, strict=True):
            if (
                isinstance(answer, dict)
                and answer.get("role") == "leader"
                and int(answer.get("term", 0)) > self.term
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

    def state(self) -> dict[str, Any]:
        """``/leader`` and ``/peer/state``: this control plane, its role, who leads."""
        leader = self.leader_record()
        if self.leading:
            info: dict[str, Any] | None = {
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
        """A standby sends agents to the leader's agents' port."""
        if self.leading:
            return None
        leader = self.leader_record()
        return leader.agent_address if leader else None

    def listing(self) -> list[dict[str, Any]]:
        """``/api/v1/servers``: every control plane as this one knows it."""
        out = []
        for s in sorted(self.servers.values(), key=lambda r: r.name):
            if s.name == self.name:
                state: dict[str, Any] | None = self.state()
                contact: float | None = time.time()
            else:
                seen = self.seen.get(s.name)
                contact, state = seen if seen else (None, None)
                if contact is not None and time.time() - contact > 3 * WATCH:
                    state = None  # not answering now
            out.append(
                {
                    "name": s.name,
                    "role": state.get("role") if state else ("removed" if s.removed_at else None),
                    "term": state.get("term") if state else None,
                    "answers": state is not None,
                    "api_address": s.api_address,
                    "agent_address": s.agent_address,
                    "peer_address": s.peer_address,
                    "last_contact": contact,
                    "lag_seconds": state.get("lag_seconds") if state else None,
                    "problem": state.get("problem") if state else None,
                    "joined_at": s.joined_at,
                    "removed_at": s.removed_at,
                    "this": s.name == self.name,
                }
            )
        return out

    # ------------------------------------------------------------------ the link

    def counts(self) -> dict[str, int]:
        """Control planes of the cluster, and how many answer now (this one included)."""
        listed = self.listing()
        current = [s for s in listed if s["removed_at"] is None]
        return {"total": len(current), "answering": sum(1 for s in current if s["answers"])}

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
        return await sqlitesync.snapshot(self.store, dest)

    async def changes(self, after: int, wait: float) -> dict[str, Any]:
        if not self.leading:
            raise NotLeading(self._not_leading())
        deadline = time.monotonic() + wait
        while True:
            try:
                changes = await sqlitesync.changes_after(self.store, after)
            except sqlitesync.TooFarBehind as exc:
                raise Behind(str(exc)) from None
            if changes or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        return {
            "term": self.term,
            "leader": self.name,
            "seq": await sqlitesync.latest_seq(self.store),
            "changes": [c.as_json() for c in changes],
        }

    def fleet(self) -> list[dict[str, Any]]:
        if not self.leading:
            raise NotLeading(self._not_leading())
        return self.hooks.fleet()

    async def usage(self, rows: list[list[Any]], sender: str) -> None:
        if not self.leading:
            raise NotLeading(self._not_leading())
        clean = []
        for row in rows:
            day, key, model, replica, n, prompt, completion = row
            clean.append(
                (str(day), str(key), str(model), str(replica), int(n), int(prompt), int(completion))
            )
        await self.hooks.usage(clean)

    def _not_leading(self) -> str:
        leader = self.leader_record()
        where = f"{leader.name} at {leader.peer_address}" if leader else "unknown"
        return f"{self.name} is a standby; the leader is {where}"
