"""The fleet's workflows: what an operator asks of the nodes themselves.

``FleetService`` answers for one node or all (``404`` for a node never enrolled, ``409``
for one not connected now), starts and stops shards by hand, reads an agent's or a
shard's log (once, or followed), lists each node's weights cache and collects what no
shard uses, and sets a node's marks (cordon, drain, labels). Each change is audited
under the caller's name; the admin API's routes and the admin pages call these alike.

A shard started by hand carries fingerprint ``direct``, which the reconciler leaves
alone; the control plane adds its engine key, derived from the cluster secret and the
replica id, as for the reconciler's own.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any, Literal

from llmgw import pki
from llmgw.server.fleet.history import NodeSeries
from llmgw.server.fleet.nodeview import NodeView, Session
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import LabelsRequest, LogsQuery, StartShardRequest
from llmgw.server.store import Audit
from llmgw.wire.admin import DownloadJson, ShardJson
from llmgw.wire.messages import Compute, ShardSpec, ShardUsage, StartShard, StopShard

Mark = Literal["cordon", "uncordon", "drain", "labels"]
MARKS: tuple[Mark, ...] = ("cordon", "uncordon", "drain", "labels")

log = logging.getLogger("llmgw.nodes")


def shard_rows(nodes: list[NodeView]) -> list[ShardJson]:
    """Every shard every node reports, with its download in progress, as plain fields."""
    rows: list[ShardJson] = []
    for view in nodes:
        for replica_id, shard in sorted(view.shards.items()):
            download: DownloadJson | None = None
            for progress in view.downloads.values():
                if replica_id in progress.get("replica_ids", []):
                    download = {
                        # A DownloadProgress's map: source and done are always there.
                        "source": progress["source"],
                        "done": progress["done"],
                        "total": progress.get("total"),
                        "file": progress.get("file"),
                    }
            usage = view.usage.get(replica_id) or ShardUsage(replica_id)
            compute = shard.compute or Compute()
            rows.append(
                {
                    "replica_id": replica_id,
                    "node": view.id,
                    "state": str(shard.state),
                    "reason": shard.reason,
                    "engine": shard.engine,
                    "port": shard.port,
                    "pid": shard.pid,
                    "fingerprint": shard.fingerprint,
                    "source": shard.source,
                    "started_at": shard.started_at,
                    "backend": compute.backend,
                    "devices": list(compute.devices),
                    "offloaded_layers": compute.offloaded_layers,
                    "total_layers": compute.total_layers,
                    "cpu_percent": usage.cpu_percent,
                    "rss": usage.rss,
                    "download": download,
                    "last_lines": shard.last_lines,
                }
            )
    return rows


class NodeAnswerError(Exception):
    """A node answered a request with a failure, or not at all."""


async def one_answer(view: NodeView, kind: str, args: dict[str, Any], timeout: float = 60.0) -> Any:
    """The result of one request to a connected node's agent."""
    session = view.session
    if session is None:
        raise NodeAnswerError(f"node {view.id} is not connected")
    try:
        async for answer in session.ask(kind, args, timeout=timeout):
            if not answer.ok:
                raise NodeAnswerError(answer.error or f"{kind} failed")
            return answer.result
    except (TimeoutError, ConnectionError) as exc:
        raise NodeAnswerError(str(exc) or f"node {view.id} gave no answer") from None
    raise NodeAnswerError(f"node {view.id} gave no answer")


class FleetService:
    def __init__(self, registry: NodeRegistry, secret: bytes) -> None:
        self.registry = registry
        self.secret = secret

    # ------------------------------------------------------------------ reading

    def nodes(self) -> list[NodeView]:
        return [v for _, v in sorted(self.registry.nodes.items())]

    def node(self, node_id: str) -> NodeView:
        view = self.registry.nodes.get(node_id)
        if view is None:
            raise Refusal(404, "not_found", f"no node {node_id!r}; see `llmgw ctl nodes`")
        return view

    def connected(self, node_id: str) -> tuple[NodeView, Session]:
        view = self.node(node_id)
        if view.session is None:
            raise Refusal(
                409,
                "node_unavailable",
                f"node {node_id!r} is not connected now "
                f"({view.state}{': ' + view.reason if view.reason else ''})",
            )
        return view, view.session

    def history(self, node_id: str, minutes: int) -> NodeSeries:
        """A node's last ``minutes`` of figures; empty series for a node enrolled but not
        heard from since this control plane started."""
        view = self.node(node_id)
        history = self.registry.history
        found = history.series(view.id, minutes)
        if found is not None:
            return found
        return {
            "node": view.id,
            "step_seconds": history.step,
            "t": [],
            "cpu_percent": [],
            "memory_used": [],
            "memory_total": [],
            "gpus": [],
        }

    # ----------------------------------------------------------- shards by hand

    async def start_shard(self, node_id: str, ask: StartShardRequest, by: Principal) -> NodeView:
        view, session = self.connected(node_id)
        fields = asdict(ask)
        fields.update(args=list(ask.args), cards=list(ask.cards))
        spec = ShardSpec(**fields, key=pki.engine_key(self.secret, ask.replica_id))
        await session.send(StartShard(spec=spec))
        await self.registry.store.audit(
            by.name, "shard.start", f"{view.id}/{ask.replica_id}", spec.source
        )
        return view

    async def stop_shard(self, node_id: str, replica_id: str, by: Principal) -> NodeView:
        view, session = self.connected(node_id)
        await session.send(StopShard(replica_id=replica_id))
        await self.registry.store.audit(by.name, "shard.stop", f"{view.id}/{replica_id}")
        return view

    # -------------------------------------------------------------------- logs

    async def logs(self, node_id: str, ask: LogsQuery) -> Any:
        """The last ``ask.n`` lines of the agent's log or a shard's."""
        _, session = self.connected(node_id)
        args = {"source": ask.source, "n": ask.n, "follow": False}
        try:
            async for answer in session.ask("logs", args):
                if not answer.ok:
                    raise Refusal(404, "not_found", answer.error or "no such log")
                return answer.result
        except (TimeoutError, ConnectionError) as exc:
            raise Refusal(504, "node_timeout", str(exc) or "no answer") from None
        raise Refusal(504, "node_timeout", "no answer")

    def follow_logs(self, node_id: str, ask: LogsQuery) -> AsyncIterator[Any]:
        """A log followed: each batch of lines as the node sends it (an empty one now and
        then, so a quiet log does not time out); ``{"error": ...}`` ends it."""
        _, session = self.connected(node_id)
        args = {"source": ask.source, "n": ask.n, "follow": True}

        async def batches() -> AsyncIterator[Any]:
            async for answer in session.ask("logs", args, timeout=60):
                if not answer.ok:
                    yield {"error": answer.error}
                    return
                yield answer.result

        return batches()

    # ----------------------------------------------------------------- weights

    def _reachable(self, node: str | None) -> list[NodeView]:
        return [
            view
            for node_id, view in sorted(self.registry.nodes.items())
            if (not node or node_id == node) and view.session is not None
        ]

    async def weights(self, node: str | None) -> list[dict[str, Any]]:
        """Each connected node's weights cache (one node's, when named), each entry marked
        with whether a shard uses it now."""
        out: list[dict[str, Any]] = []
        wanted = self.registry.wanted_sources()
        for view in self._reachable(node):
            try:
                listing = await one_answer(view, "weights.list", {}, timeout=15.0)
            except NodeAnswerError as exc:
                # A node that answered with a failure says so, as one that did not answer.
                out.append({"node": view.id, "error": str(exc)})
                continue
            for entry in listing or []:
                entry["node"] = view.id
                entry["wanted"] = entry.get("source") in wanted
                out.append(entry)
        return out

    async def collect(self, node: str | None, by: Principal) -> list[dict[str, Any]]:
        """Ask each node to delete the weights no shard uses; each node re-checks every
        path itself, and the summary comes from what it lists afterwards."""
        wanted = self.registry.wanted_sources()
        out: list[dict[str, Any]] = []
        for view in self._reachable(node):
            try:
                listing = await one_answer(view, "weights.list", {})
                unused = [e["name"] for e in listing if e.get("source") not in wanted]
                done = await one_answer(view, "weights.collect", {"names": unused})
                after = {e["name"] for e in await one_answer(view, "weights.list", {})}
            except NodeAnswerError as exc:
                out.append({"node": view.id, "error": str(exc)})
                continue
            await self.registry.store.audit(
                by.name,
                "weights.collect",
                view.id,
                f"asked {len(unused)}, removed {len(done['removed'])}",
            )
            out.append(
                {
                    "node": view.id,
                    "asked": unused,
                    "removed": done["removed"],
                    "kept": done["kept"],
                    "freed_bytes": done["freed_bytes"],
                    "still_listed": sorted(after & set(unused)),
                }
            )
        return out

    async def remove_source(self, source: str, by: Principal) -> None:
        """Ask every connected node to delete its copy of ``source`` (a model removed
        with its files, once nothing runs it)."""
        for view in self._reachable(None):
            try:
                listing = await one_answer(view, "weights.list", {}, timeout=15.0)
                names = [e["name"] for e in listing or [] if e.get("source") == source]
                if names:
                    done = await one_answer(view, "weights.collect", {"names": names}, 15.0)
                    removed = (done or {}).get("removed", [])
                    await self.registry.store.audit(
                        by.name, "weights.remove", view.id, f"{source}: {removed}"
                    )
            except NodeAnswerError as exc:
                log.warning("could not remove %s from %s: %s", source, view.id, exc)

    # ------------------------------------------------------------------- marks

    async def mark(
        self, node_id: str, action: Mark, by: Principal, labels: LabelsRequest | None = None
    ) -> NodeView:
        """Cordon (no new replicas), uncordon (also ends a drain), drain (its replicas
        are replaced elsewhere), or set and remove labels."""
        view = self.node(node_id)
        wanted = dict(view.labels)
        cordoned, draining = view.cordoned, view.draining
        if action == "cordon":
            cordoned = True
        elif action == "uncordon":
            cordoned, draining = False, False
        elif action == "drain":
            cordoned, draining = True, True
        elif labels is not None:
            wanted.update(labels.set or {})
            for key in labels.remove:
                wanted.pop(key, None)
        audit = Audit(by.name, f"node.{action}", node_id)
        await self.registry.set_scheduling(view, cordoned, draining, wanted, audit)
        return view
