"""A standby following its leader: the store, by a snapshot and then every change, and
the fleet (which replicas run Ready where), every two seconds.

The store is SQLite's own copy (``sqlitesync``): the first time, or after the leader
changed, its term moved or it pruned changes this standby had not read, the whole store
is taken again from a snapshot; otherwise the changes after the last one applied are
asked for with a long poll, so a change reaches the standby within a round trip.

A standby whose store holds a higher term than the control plane it was told to follow
refuses to follow it: that one lost its leadership, and following it would undo writes
made since. It says so in ``problem`` (``/leader``, ``ctl servers``) and keeps serving
from what it has.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from llmgw.jsonvalue import JSONObject, as_int, as_list, as_object, as_str
from llmgw.server.ha import sqlitesync
from llmgw.server.ha.peerlink import PeerClient, PeerError
from llmgw.server.store import SQLiteStore, Store

log = logging.getLogger("llmgw.ha")

TERM_SETTING = "ha.term"
LEADER_SETTING = "ha.leader"
# How long the leader may hold a request for changes, and how often the fleet is asked.
POLL = 1.0
FLEET_EVERY = 2.0
RETRY = 0.5


async def store_term(store: Store) -> int:
    value = await store.get_setting(TERM_SETTING)
    return int(value) if value and value.isdigit() else 0


class Follower:
    def __init__(
        self,
        store: Store,
        client: PeerClient,
        leader: str,
        applied: Callable[[set[str]], Awaitable[None]],
        fleet: Callable[[list[JSONObject]], None],
        moved: Callable[[str], None],
        ships: bool = True,
    ) -> None:
        self.store = store
        # SQLite: the leader ships its store here. PostgreSQL: the store is the same one,
        # read again every second.
        self.ships = ships
        self.client = client
        # The leader's address on the control planes' link.
        self.leader = leader
        self.leader_name: str | None = None
        self.term = 0
        self.seq = 0
        self._applied = applied
        self._fleet = fleet
        self._moved = moved
        # Wall clock of the leader's last answer; monotonic time this standby last held
        # every change the leader had (the lag is measured from it).
        self.last_contact: float | None = None
        self.caught_up: float | None = None
        self.problem = ""

    @property
    def sqlite(self) -> SQLiteStore:
        return cast(SQLiteStore, self.store)

    def lag(self) -> float | None:
        """Seconds since this standby last held every change the leader had."""
        if self.caught_up is None:
            return None
        return round(max(0.0, time.monotonic() - self.caught_up - POLL), 3)

    async def run(self, stop: asyncio.Event) -> None:
        fleet = asyncio.create_task(self._follow_fleet(stop))
        try:
            while not stop.is_set():
                try:
                    if self.ships:
                        await self._follow_store(stop)
                    else:
                        await self._read_store(stop)
                except (PeerError, sqlitesync.TooFarBehind) as exc:
                    self._said(str(exc))
                except Exception as exc:
                    log.exception("following %s failed", self.leader)
                    self._said(f"following {self.leader} failed: {exc}")
                await _sleep(stop, RETRY)
        finally:
            fleet.cancel()
            await asyncio.gather(fleet, return_exceptions=True)

    def _said(self, problem: str) -> None:
        if problem != self.problem:
            log.warning("standby: %s", problem)
        self.problem = problem

    async def _follow_store(self, stop: asyncio.Event) -> None:
        state = as_object(await self.client.json("GET", self.leader, "/peer/state"))
        if state.get("role") != "leader":
            peer = as_object(state.get("leader") or {}).get("peer_address")
            if isinstance(peer, str) and peer and peer != self.leader:
                log.info("%s says %s leads: following it", self.leader, peer)
                self.leader = peer
                self._moved(peer)
                return
            raise PeerError(f"{self.leader} does not lead and knows no leader")
        mine = await store_term(self.store)
        name, term = as_str(state["name"]), as_int(state["term"])
        if mine > term:
            raise PeerError(
                f"refusing to follow {state['name']} at {self.leader}: it leads with term "
                f"{state['term']} but this store holds term {mine}, so it lost its "
                "leadership; point this standby at the current leader, or make this one lead "
                "with `llmgw server promote`"
            )
        seq, leader_name, applied_term = await sqlitesync.applied(self.sqlite)
        if leader_name != name or applied_term != term or seq == 0:
            seq = await self._snapshot(name)
        self.seq, self.leader_name, self.term = seq, name, term
        self.problem = ""
        while not stop.is_set():
            try:
                found = await self.client.json(
                    "GET",
                    self.leader,
                    "/peer/changes",
                    params={"after": str(self.seq), "wait": str(POLL)},
                    timeout=POLL + 10,
                )
            except PeerError as exc:
                if exc.status == 410:  # pruned before this standby read them: start over
                    await sqlitesync.mark(self.sqlite, 0, self.leader_name, self.term)
                raise
            self.last_contact = time.time()
            answer = as_object(found)
            if as_int(answer["term"]) != self.term or answer["leader"] != self.leader_name:
                return  # a new term: start again from the leader's state
            changes = [sqlitesync.Change.from_json(c) for c in as_list(answer["changes"])]
            if changes:
                self.seq = await sqlitesync.apply(self.sqlite, changes, name, self.term)
                await self._applied({c.table for c in changes})
            if self.seq >= as_int(answer["seq"]):
                self.caught_up = time.monotonic()

    async def _read_store(self, stop: asyncio.Event) -> None:
        """The shared store: what is kept in memory read again every second."""
        while not stop.is_set():
            await self._applied({"*"})
            self.caught_up = time.monotonic()
            self.problem = ""
            await _sleep(stop, POLL)

    async def _snapshot(self, name: str) -> int:
        with tempfile.TemporaryDirectory(prefix="llmgw-follow-") as tmp:
            dest = Path(tmp) / "store.db"
            seq, term = await self.client.snapshot(self.leader, dest)
            await sqlitesync.restore(self.sqlite, dest)
        await sqlitesync.mark(self.sqlite, seq, name, term)
        log.info("standby: took %s's store at change %d, term %d", name, seq, term)
        await self._applied({"*"})
        return seq

    async def _follow_fleet(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                nodes = as_list(await self.client.json("GET", self.leader, "/peer/fleet"))
                self._fleet([as_object(node) for node in nodes])
                self.last_contact = time.time()
            except PeerError:
                pass  # said by the store's loop; serving goes on from the last fleet
            await _sleep(stop, FLEET_EVERY)


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
