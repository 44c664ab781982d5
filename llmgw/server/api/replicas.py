"""Replicas and nodes as the admin API shows them, the direct shard controls, logs and
weights.

The catalog's replicas are started by the reconciler; beside them an operator (or a
test) may start a shard on a named node by hand with ``POST /api/v1/nodes/{id}/shards``
(fingerprint ``direct``, which the reconciler leaves alone); the control plane adds the
engine key, derived from the cluster secret and the replica id, and sends StartShard.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from starlette.responses import StreamingResponse

from llmgw import pki
from llmgw.server.api.routing import Call, Op
from llmgw.server.catalog.service import ModelService
from llmgw.server.fleet.registry import NodeRegistry, NodeView
from llmgw.server.refusal import Refusal
from llmgw.server.requests import (
    CollectRequest,
    HistoryQuery,
    LogsQuery,
    StartShardRequest,
    WeightsQuery,
)
from llmgw.server.store import Store
from llmgw.wire.messages import Compute, ShardSpec, StartShard, StopShard

LIST = {"type": "array", "items": {"type": "object"}}
NODE = {"type": "object", "required": ["id", "state"]}


def replica_rows(nodes: list[NodeView]) -> list[dict[str, Any]]:
    """Every shard every node reports, with its download in progress, as plain fields."""
    rows = []
    for view in nodes:
        for replica_id, shard in sorted(view.shards.items()):
            download = None
            for progress in view.downloads.values():
                if replica_id in progress.get("replica_ids", []):
                    download = {k: progress.get(k) for k in ("source", "done", "total", "file")}
            usage = view.usage.get(replica_id, {})
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
                    "cpu_percent": usage.get("cpu_percent"),
                    "rss": usage.get("rss"),
                    "download": download,
                    "last_lines": shard.last_lines,
                }
            )
    return rows


def routes(
    nodes: NodeRegistry,
    models: ModelService,
    store: Store,
    secret: bytes,
) -> list[Op]:
    def node(node_id: str) -> NodeView:
        view = nodes.nodes.get(node_id)
        if view is None:
            raise Refusal(404, "not_found", f"no node {node_id!r}; see `llmgw ctl nodes`")
        return view

    def connected(node_id: str) -> NodeView:
        view = node(node_id)
        if view.session is None:
            raise Refusal(
                409,
                "node_unavailable",
                f"node {node_id!r} is not connected now "
                f"({view.state}{': ' + view.reason if view.reason else ''})",
            )
        return view

    async def list_nodes(call: Call) -> Any:
        return [v.as_json() for _, v in sorted(nodes.nodes.items())]

    async def show_node(call: Call) -> Any:
        return node(call.params["node_id"]).as_json()

    async def history(call: Call) -> Any:
        ask: HistoryQuery = call.query
        view = node(call.params["node_id"])
        found = nodes.history.series(view.id, ask.minutes)
        if found is not None:
            return found
        # Enrolled but not heard from since this control plane started.
        empty: dict[str, Any] = {"node": view.id, "step_seconds": nodes.history.step, "t": []}
        return {**empty, "cpu_percent": [], "memory_used": [], "memory_total": [], "gpus": []}

    async def replicas(call: Call) -> Any:
        rows = replica_rows([v for _, v in sorted(nodes.nodes.items())])
        reconciler = models.reconciler
        for row in rows:
            row.update(reconciler.describe(row["replica_id"], models.models, row["fingerprint"]))
            track = reconciler.tracks.get(row["replica_id"])
            row["cards"] = list(track.cards) if track else []
        return rows

    async def start_shard(call: Call) -> Any:
        view = connected(call.params["node_id"])
        ask: StartShardRequest = call.body
        fields = asdict(ask)
        fields.update(args=list(ask.args), cards=list(ask.cards))
        spec = ShardSpec(**fields, key=pki.engine_key(secret, ask.replica_id))
        assert view.session is not None
        await view.session.send(StartShard(spec=spec))
        await store.audit(call.actor, "shard.start", f"{view.id}/{ask.replica_id}", spec.source)
        return {"replica_id": ask.replica_id, "node": view.id}

    async def stop_shard(call: Call) -> Any:
        view = connected(call.params["node_id"])
        replica_id = call.params["replica_id"]
        assert view.session is not None
        await view.session.send(StopShard(replica_id=replica_id))
        await store.audit(call.actor, "shard.stop", f"{view.id}/{replica_id}")
        return {"replica_id": replica_id, "node": view.id}

    async def logs(call: Call) -> Any:
        view = connected(call.params["node_id"])
        session = view.session
        assert session is not None
        ask: LogsQuery = call.query
        args = {"source": ask.source, "n": ask.n, "follow": ask.follow}
        if not ask.follow:
            try:
                async for answer in session.ask("logs", args):
                    if not answer.ok:
                        raise Refusal(404, "not_found", answer.error or "no such log")
                    return answer.result
            except (TimeoutError, ConnectionError) as exc:
                raise Refusal(504, "node_timeout", str(exc) or "no answer") from None
            raise Refusal(504, "node_timeout", "no answer")

        async def lines() -> AsyncIterator[bytes]:
            # Followed: one JSON list of lines per answer, newline-delimited; the node
            # sends an empty answer now and then so a quiet log does not time out.
            async for answer in session.ask("logs", args, timeout=60):
                if not answer.ok:
                    yield (json.dumps({"error": answer.error}) + "\n").encode()
                    return
                yield (json.dumps(answer.result) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def weights(call: Call) -> Any:
        wanted_node = call.query.node
        out = []
        wanted = nodes.wanted_sources()
        for node_id, view in sorted(nodes.nodes.items()):
            if wanted_node and node_id != wanted_node or view.session is None:
                continue
            try:
                async for answer in view.session.ask("weights.list", {}):
                    for entry in answer.result or []:
                        entry["node"] = node_id
                        entry["wanted"] = entry.get("source") in wanted
                        out.append(entry)
            except (TimeoutError, ConnectionError) as exc:
                out.append({"node": node_id, "error": str(exc)})
        return out

    async def one_answer(view: NodeView, kind: str, args: dict[str, Any]) -> Any:
        assert view.session is not None
        async for answer in view.session.ask(kind, args, timeout=60):
            if not answer.ok:
                raise RuntimeError(answer.error or f"{kind} failed")
            return answer.result
        raise ConnectionError(f"node {view.id} gave no answer")

    async def collect(call: Call) -> Any:
        """Ask each node to delete the weights no shard uses; each node re-checks every
        path itself, and the summary comes from what it lists afterwards."""
        wanted_node = call.body.node
        wanted = nodes.wanted_sources()
        out: list[dict[str, Any]] = []
        for node_id, view in sorted(nodes.nodes.items()):
            if wanted_node and node_id != wanted_node or view.session is None:
                continue
            try:
                listing = await one_answer(view, "weights.list", {})
                unused = [e["name"] for e in listing if e.get("source") not in wanted]
                done = await one_answer(view, "weights.collect", {"names": unused})
                after = {e["name"] for e in await one_answer(view, "weights.list", {})}
            except (TimeoutError, ConnectionError, RuntimeError) as exc:
                out.append({"node": node_id, "error": str(exc)})
                continue
            await store.audit(
                call.actor,
                "weights.collect",
                node_id,
                f"asked {len(unused)}, removed {len(done['removed'])}",
            )
            out.append(
                {
                    "node": node_id,
                    "asked": unused,
                    "removed": done["removed"],
                    "kept": done["kept"],
                    "freed_bytes": done["freed_bytes"],
                    "still_listed": sorted(after & set(unused)),
                }
            )
        return out

    shard = {"type": "object", "required": ["replica_id", "node"]}
    return [
        Op(
            "GET",
            "/api/v1/nodes",
            list_nodes,
            "Every node",
            answer={"type": "array", "items": NODE},
        ),
        Op("GET", "/api/v1/nodes/{node_id}", show_node, "One node", answer=NODE, errors=(404,)),
        Op(
            "GET",
            "/api/v1/nodes/{node_id}/history",
            history,
            "A node's last hour at 10 s steps: CPU, memory, each card's work, memory, "
            "power and temperature (absent points are null)",
            query=HistoryQuery,
            answer={"type": "object", "required": ["node", "step_seconds", "t", "gpus"]},
            errors=(404,),
        ),
        Op("GET", "/api/v1/replicas", replicas, "Every shard every node reports", answer=LIST),
        Op(
            "POST",
            "/api/v1/nodes/{node_id}/shards",
            start_shard,
            "Start a shard on a node by hand",
            body=StartShardRequest,
            status=202,
            answer=shard,
            errors=(404, 409),
        ),
        Op(
            "DELETE",
            "/api/v1/nodes/{node_id}/shards/{replica_id}",
            stop_shard,
            "Stop a shard",
            status=202,
            answer=shard,
            errors=(404, 409),
        ),
        Op(
            "GET",
            "/api/v1/nodes/{node_id}/logs",
            logs,
            "A node's or a shard's last log lines (followed: newline-delimited JSON)",
            query=LogsQuery,
            answer=LIST,
            errors=(404, 409, 504),
        ),
        Op(
            "GET",
            "/api/v1/weights",
            weights,
            "Each node's weights cache",
            query=WeightsQuery,
            answer=LIST,
        ),
        Op(
            "POST",
            "/api/v1/weights/collect",
            collect,
            "Delete the weights no shard uses",
            body=CollectRequest,
            body_optional=True,
            answer=LIST,
        ),
    ]
