"""``llmgw restart``: every llmgw process of the cluster started again in place, the
engines serving throughout.

The order, each step waited for before the next:

1. every agent, ``AT_ONCE`` at a time, over its stream (``Request`` ``restart``: it
   answers, then execs itself; its engines are its children and the new agent adopts
   them). An agent is back when a new stream of its node registers after it was asked,
   on the same version. Its engines' pids (its replicas' as it reported them) before
   and after say whether they kept serving. A node whose agent is not connected, or
   does not list ``restart.v1`` in its Register's features (an older agent), is
   skipped and named;
2. the other control planes over the control planes' link (``POST /peer/restart``),
   standbys before a leader, one at a time: each is back when its ``/peer/state`` says a
   later start;
3. this one (``relaunch``), last: its answers stop, and whoever asked (``llmgw
   restart``) waits for ``/api/v1/status`` to answer with a later start.

The first failure stops the run and says where; nothing after it is asked. The run lives
in this control plane's memory: after step 3 a new process knows none (``idle``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.ha.leadership import Leadership
from llmgw.server.ha.peerlink import PeerError
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import Store
from llmgw.wire.admin import RestartAgentJson, RestartJson, RestartPlaneJson
from llmgw.wire.states import NodeState

log = logging.getLogger("llmgw.restart")

FEATURE = "restart.v1"
# How long an agent may take to answer, and then to be back on a new stream.
ASK_TIMEOUT = 15.0
AGENT_BACK = 90.0
# How long another control plane may take to answer its /peer/state with a later start.
PLANE_BACK = 90.0
# Agents asked at once: each new agent's first handshake comes at once (no spread, as
# after a lost stream), so thousands asked together would land on the agents' port in
# the same second.
AT_ONCE = 64
# How often an agent's node and a control plane's state are looked at while waiting.
POLL = 0.25
# A moment between saying this control plane restarts (GET /api/v1/restart) and doing it.
LAST_WORD = 1.0


@dataclass(frozen=True)
class Plane:
    """Another control plane of the cluster: its name, where its link answers, and its
    role as it last said (None: not heard from)."""

    name: str
    peer_address: str
    role: str | None


# ``POST /peer/restart`` of a control plane, and its ``started`` (``GET /peer/state``).
AskPeer = Callable[[str], Awaitable[None]]
PeerStarted = Callable[[str], Awaitable[float | None]]


class RestartRunning(Refusal):
    def __init__(self) -> None:
        super().__init__(
            409,
            "restart_running",
            "a restart is already under way here; `llmgw restart` waits for it, or read "
            "GET /api/v1/restart",
        )


class ClusterRestart:
    def __init__(
        self,
        registry: NodeRegistry,
        this: str,
        others: Callable[[], list[Plane]],
        ask_peer: AskPeer,
        peer_started: PeerStarted,
        relaunch: Callable[[str], None],
        audit: Callable[[str, str], Awaitable[None]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.this = this
        self.others = others
        self.ask_peer = ask_peer
        self.peer_started = peer_started
        self.relaunch = relaunch
        self.audit = audit
        self.clock = clock
        self.doc: RestartJson = {
            "stage": "idle",
            "asked_at": None,
            "by": None,
            "this": this,
            "agents": [],
            "control_planes": [],
            "error": None,
        }
        self._task: asyncio.Task[None] | None = None

    def status(self) -> RestartJson:
        return self.doc

    async def start(self, by: Principal) -> RestartJson:
        """Plan the run, start it, and answer with the plan."""
        if self._task is not None and not self._task.done():
            raise RestartRunning()
        agents = [self._agent_row(v) for v in sorted(self.registry.nodes.values(), key=_by_id)]
        planes = sorted(self.others(), key=lambda p: (p.role == "leader", p.name))
        rows: list[RestartPlaneJson] = [
            {"name": p.name, "role": p.role, "state": "waiting", "reason": None, "started": None}
            for p in planes
        ]
        rows.append(
            {
                "name": self.this,
                "role": "leader",
                "state": "waiting",
                "reason": None,
                "started": None,
            }
        )
        self.doc = {
            "stage": "agents",
            "asked_at": self.clock(),
            "by": by.name,
            "this": self.this,
            "agents": agents,
            "control_planes": rows,
            "error": None,
        }
        await self.audit(by.name, f"{len(agents)} node(s), {len(rows)} control plane(s)")
        self._task = asyncio.get_running_loop().create_task(self._run(planes))
        return self.doc

    def _agent_row(self, view: NodeView) -> RestartAgentJson:
        reason = None
        if view.session is None:
            reason = "its agent is not connected"
        elif FEATURE not in view.features:
            reason = f"its agent ({view.version or 'an older llmgw'}) does not answer restart"
        return {
            "node": view.id,
            "state": "skipped" if reason else "waiting",
            "reason": reason,
            "version": view.version,
            "engines": _pids(view),
            "engines_kept": None,
        }

    async def _run(self, planes: list[Plane]) -> None:
        try:
            await self._agents()
            self.doc["stage"] = "control_planes"
            for plane, row in zip(planes, self.doc["control_planes"], strict=False):
                await self._plane(plane, row)
        except _Stopped as exc:
            self.doc["stage"] = "failed"
            self.doc["error"] = str(exc)
            log.warning("restart stopped: %s", exc)
            return
        except Exception as exc:
            self.doc["stage"] = "failed"
            self.doc["error"] = f"{type(exc).__name__}: {exc}"
            log.exception("restart failed")
            return
        self.doc["stage"] = "this"
        self.doc["control_planes"][-1]["state"] = "restarting"
        # The last word read by the one waiting, then this process again in place.
        await asyncio.sleep(LAST_WORD)
        self.relaunch("llmgw restart")

    async def _agents(self) -> None:
        rows = [r for r in self.doc["agents"] if r["state"] == "waiting"]
        turns = asyncio.Semaphore(AT_ONCE)

        async def one(row: RestartAgentJson) -> None:
            async with turns:
                await self._agent(row)

        done = await asyncio.gather(*(one(r) for r in rows), return_exceptions=True)
        failed = [f"{r['node']}: {r['reason']}" for r in rows if r["state"] == "failed"]
        for row, outcome in zip(rows, done, strict=True):
            if isinstance(outcome, BaseException) and row["state"] != "failed":
                row["state"], row["reason"] = "failed", f"{type(outcome).__name__}: {outcome}"
                failed.append(f"{row['node']}: {row['reason']}")
        if failed:
            raise _Stopped(
                "not every agent came back, so no control plane was restarted: " + "; ".join(failed)
            )

    async def _agent(self, row: RestartAgentJson) -> None:
        view = self.registry.nodes[row["node"]]
        old = view.session
        if old is None:
            row["state"], row["reason"] = "skipped", "its agent is not connected"
            return
        try:
            async for answer in old.ask("restart", {}, timeout=ASK_TIMEOUT):
                if not answer.ok:
                    row["state"] = "failed"
                    row["reason"] = f"it said no: {answer.error or 'no reason given'}"
                    return
        except ConnectionError:
            pass  # its stream went as it answered: what a restart looks like
        except TimeoutError as exc:
            if view.session is old:  # neither an answer nor gone: not restarting
                row["state"], row["reason"] = "failed", str(exc)
                return
        row["state"] = "asked"
        deadline = self.clock() + AGENT_BACK
        while not _back(view, old):
            if self.clock() > deadline:
                row["state"] = "failed"
                row["reason"] = f"its agent did not come back within {AGENT_BACK:g} s"
                return
            await asyncio.sleep(POLL)
        if view.version != row["version"]:
            row["state"] = "failed"
            row["reason"] = f"it came back on {view.version}, not {row['version']}"
            return
        after = _pids(view)
        row["engines_kept"] = all(after.get(r) == pid for r, pid in row["engines"].items())
        row["state"] = "back"

    async def _plane(self, plane: Plane, row: RestartPlaneJson) -> None:
        try:
            before = await self.peer_started(plane.peer_address)
            row["started"] = before
            await self.ask_peer(plane.peer_address)
        except ConnectionError as exc:
            row["state"], row["reason"] = "failed", str(exc)
            raise _Stopped(f"control plane {plane.name} was not restarted: {exc}") from None
        row["state"] = "asked"
        deadline = self.clock() + PLANE_BACK
        while True:
            try:
                started = await self.peer_started(plane.peer_address)
            except ConnectionError:
                started = None  # down while it starts again
            if started is not None and (before is None or started > before):
                row["started"], row["state"] = started, "back"
                return
            if self.clock() > deadline:
                row["state"] = "failed"
                row["reason"] = f"it did not answer again within {PLANE_BACK:g} s"
                raise _Stopped(f"control plane {plane.name} did not come back")
            await asyncio.sleep(POLL)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class _Stopped(Exception):
    """The run stops here; the words say where."""


def _by_id(view: NodeView) -> str:
    return view.id


def _pids(view: NodeView) -> dict[str, int | None]:
    return {replica: s.pid for replica, s in sorted(view.shards.items())}


def _back(view: NodeView, old: object) -> bool:
    """A new stream of the node registered since it was asked."""
    return view.session is not None and view.session is not old and view.state == NodeState.READY


def cluster_restart(
    registry: NodeRegistry, ha: Leadership, store: Store, relaunch: Callable[[str], None]
) -> ClusterRestart:
    """The run as the control plane builds it: the other control planes from the store's
    list (roles as they last said), asked over the control planes' link."""

    def others() -> list[Plane]:
        planes = []
        for s in ha.servers.values():
            if s.name == ha.name or s.removed_at is not None:
                continue
            seen = ha.seen.get(s.name)
            role = seen[1].get("role") if seen else None
            planes.append(Plane(s.name, s.peer_address, role if isinstance(role, str) else None))
        return planes

    async def ask_peer(address: str) -> None:
        try:
            await ha.client.json("POST", address, "/peer/restart", {}, timeout=10)
        except PeerError as exc:
            raise ConnectionError(str(exc)) from None

    async def peer_started(address: str) -> float | None:
        try:
            answer = await ha.client.json("GET", address, "/peer/state", timeout=2)
        except PeerError as exc:
            raise ConnectionError(str(exc)) from None
        started = answer.get("started") if isinstance(answer, dict) else None
        return float(started) if isinstance(started, int | float) else None

    async def audit(actor: str, detail: str) -> None:
        await store.audit(actor, "cluster.restart", "cluster", detail)

    return ClusterRestart(registry, ha.name, others, ask_peer, peer_started, relaunch, audit)
