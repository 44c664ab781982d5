"""Nodes and replicas as the admin API shows them, the direct shard controls, logs and
weights: routes over ``FleetService`` (``fleet/service.py``) and, for the catalog's view
of each replica, ``ModelViews``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.service import FleetService
from llmgw.server.requests import (
    CollectRequest,
    HistoryQuery,
    LogsQuery,
    StartShardRequest,
    WeightsQuery,
)
from llmgw.wire.admin import NodeJson, ReplicaJson, ShardAskedJson

LIST = {"type": "array", "items": {"type": "object"}}
NODE = {"type": "object", "required": ["id", "state"]}


def node_json(view: NodeView, slurm: str | None = None) -> NodeJson:
    """A node as the API shows it. ``NodeView.as_json`` builds it from the agent's maps;
    tests/server/api/test_answer_shapes.py holds its keys and values to ``NodeJson``.
    ``slurm``: the node's stage in Slurm's set (``lent``...), None when not in it."""
    shown = view.as_json()
    shown["slurm"] = slurm
    return shown


def routes(
    fleet: FleetService,
    views: ModelViews,
    slurm_stage: Callable[[str], str | None] = lambda node: None,
) -> Ops:
    async def list_nodes(call: Call[None, None]) -> list[NodeJson]:
        return [node_json(v, slurm_stage(v.id)) for v in fleet.nodes()]

    async def show_node(call: Call[None, None]) -> NodeJson:
        view = fleet.node(call.params["node_id"])
        return node_json(view, slurm_stage(view.id))

    async def history(call: Call[None, HistoryQuery]) -> object:
        return fleet.history(call.params["node_id"], call.query.minutes)

    async def replicas(call: Call[None, None]) -> list[ReplicaJson]:
        return views.replicas()

    async def start_shard(call: Call[StartShardRequest, None]) -> ShardAskedJson:
        ask = call.body
        view = await fleet.start_shard(call.params["node_id"], ask, call.principal)
        return {"replica_id": ask.replica_id, "node": view.id}

    async def stop_shard(call: Call[None, None]) -> ShardAskedJson:
        replica_id = call.params["replica_id"]
        view = await fleet.stop_shard(call.params["node_id"], replica_id, call.principal)
        return {"replica_id": replica_id, "node": view.id}

    async def logs(call: Call[None, LogsQuery]) -> object:
        if not call.query.follow:
            return await fleet.logs(call.params["node_id"], call.query)
        batches = fleet.follow_logs(call.params["node_id"], call.query)

        async def lines() -> AsyncIterator[bytes]:
            # One JSON list of lines per answer, newline-delimited.
            async for batch in batches:
                yield (json.dumps(batch) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def weights(call: Call[None, WeightsQuery]) -> object:
        return await fleet.weights(call.query.node)

    async def collect(call: Call[CollectRequest, None]) -> object:
        return await fleet.collect(call.body.node, call.principal)

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
            "A node's last hour at 10 s steps: CPU, memory, each card's busy "
            "(utilization.gpu), SM active, memory, power and temperature (absent points "
            "are null)",
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
