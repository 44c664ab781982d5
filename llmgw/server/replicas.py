"""Replicas as the admin API shows them, and the direct shard controls of the nodes.

The catalog's replicas are started by the reconciler; beside them an operator (or a
test) may start a shard on a named node by hand with ``POST /api/v1/nodes/{id}/shards``
(fingerprint ``direct``, which the reconciler leaves alone); the control plane adds the
engine key, derived from the cluster secret and the replica id, and sends StartShard.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmgw import pki
from llmgw.server.responses import error, json_body, unauthorised
from llmgw.wire.messages import MessageError, ShardSpec, StartShard, StopShard, from_map

if TYPE_CHECKING:
    from llmgw.server.controlplane import ControlPlane
    from llmgw.server.nodes import NodeView

REPLICA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


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
            compute = shard.get("compute") or {}
            rows.append(
                {
                    "replica_id": replica_id,
                    "node": view.id,
                    "state": shard.get("state"),
                    "reason": shard.get("reason", ""),
                    "engine": shard.get("engine"),
                    "port": shard.get("port"),
                    "pid": shard.get("pid"),
                    "fingerprint": shard.get("fingerprint"),
                    "source": shard.get("source"),
                    "started_at": shard.get("started_at"),
                    "backend": compute.get("backend"),
                    "devices": compute.get("devices", []),
                    "offloaded_layers": compute.get("offloaded_layers"),
                    "total_layers": compute.get("total_layers"),
                    "cpu_percent": usage.get("cpu_percent"),
                    "rss": usage.get("rss"),
                    "download": download,
                    "last_lines": shard.get("last_lines"),
                }
            )
    return rows


def routes(cp: ControlPlane) -> list[Route]:
    def node_or_error(request: Request) -> NodeView | JSONResponse:
        if not cp.authorised(request):
            return unauthorised()
        node_id = request.path_params["node_id"]
        view = cp.registry.nodes.get(node_id)
        if view is None:
            return error(404, "not_found", f"no node {node_id!r}; see `llmgw ctl nodes`")
        if view.session is None:
            return error(
                409,
                "node_unavailable",
                f"node {node_id!r} is not connected now "
                f"({view.state}{': ' + view.reason if view.reason else ''})",
            )
        return view

    async def replicas(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        rows = replica_rows([v for _, v in sorted(cp.registry.nodes.items())])
        reconciler = cp.models.reconciler
        for row in rows:
            row.update(reconciler.describe(row["replica_id"], cp.models.models, row["fingerprint"]))
            track = reconciler.tracks.get(row["replica_id"])
            row["cards"] = list(track.cards) if track else []
        return JSONResponse(rows)

    async def start_shard(request: Request) -> Response:
        view = node_or_error(request)
        if isinstance(view, JSONResponse):
            return view
        body = await json_body(request)
        if isinstance(body, JSONResponse):
            return body
        replica_id = str(body.get("replica_id", ""))
        if not REPLICA_ID.match(replica_id):
            return error(400, "bad_request", "replica_id: letters, digits, '.', '_', '-'")
        body["key"] = pki.engine_key(cp.cluster_secret, replica_id)
        body.setdefault("fingerprint", "direct")
        try:
            spec = from_map(ShardSpec, body)
        except MessageError as exc:
            return error(400, "bad_request", str(exc))
        assert view.session is not None
        await view.session.send(StartShard(spec=spec))
        await cp.store.audit("admin", "shard.start", f"{view.id}/{replica_id}", spec.source)
        return JSONResponse({"replica_id": replica_id, "node": view.id}, status_code=202)

    async def stop_shard(request: Request) -> Response:
        view = node_or_error(request)
        if isinstance(view, JSONResponse):
            return view
        replica_id = request.path_params["replica_id"]
        assert view.session is not None
        await view.session.send(StopShard(replica_id=replica_id))
        await cp.store.audit("admin", "shard.stop", f"{view.id}/{replica_id}")
        return JSONResponse({"replica_id": replica_id, "node": view.id}, status_code=202)

    async def logs(request: Request) -> Response:
        view = node_or_error(request)
        if isinstance(view, JSONResponse):
            return view
        assert view.session is not None
        session = view.session
        try:
            n = int(request.query_params.get("n", "100"))
        except ValueError:
            return error(400, "bad_request", "n must be a number of lines")
        args = {
            "source": request.query_params.get("source", "agent"),
            "n": n,
            "follow": request.query_params.get("follow") in ("1", "true"),
        }
        if not args["follow"]:
            try:
                async for answer in session.ask("logs", args):
                    if not answer.ok:
                        return error(404, "not_found", answer.error or "no such log")
                    return JSONResponse(answer.result)
            except (TimeoutError, ConnectionError) as exc:
                return error(504, "node_timeout", str(exc))
            return error(504, "node_timeout", "no answer")

        async def lines() -> AsyncIterator[bytes]:
            # Followed: one JSON list of lines per answer, newline-delimited; the node
            # sends an empty answer now and then so a quiet log does not time out.
            async for answer in session.ask("logs", args, timeout=60):
                if not answer.ok:
                    yield (json.dumps({"error": answer.error}) + "\n").encode()
                    return
                yield (json.dumps(answer.result) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def weights(request: Request) -> Response:
        if not cp.authorised(request):
            return unauthorised()
        wanted_node = request.query_params.get("node")
        out = []
        for node_id, view in sorted(cp.registry.nodes.items()):
            if wanted_node and node_id != wanted_node or view.session is None:
                continue
            wanted = cp.wanted_sources()
            try:
                async for answer in view.session.ask("weights.list", {}):
                    for entry in answer.result or []:
                        entry["node"] = node_id
                        entry["wanted"] = entry.get("source") in wanted
                        out.append(entry)
            except (TimeoutError, ConnectionError) as exc:
                out.append({"node": node_id, "error": str(exc)})
        return JSONResponse(out)

    async def one_answer(view: NodeView, kind: str, args: dict[str, Any]) -> Any:
        assert view.session is not None
        async for answer in view.session.ask(kind, args, timeout=60):
            if not answer.ok:
                raise RuntimeError(answer.error or f"{kind} failed")
            return answer.result
        raise ConnectionError(f"node {view.id} gave no answer")

    async def collect(request: Request) -> Response:
        """Ask each node to delete the weights no shard uses; each node re-checks every
        path itself, and the summary comes from what it lists afterwards."""
        if not cp.authorised(request):
            return unauthorised()
        try:
            body = await request.json()
        except ValueError:
            body = {}
        wanted_node = body.get("node") if isinstance(body, dict) else None
        wanted = cp.wanted_sources()
        out: list[dict[str, Any]] = []
        for node_id, view in sorted(cp.registry.nodes.items()):
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
            await cp.store.audit(
                "admin",
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
        return JSONResponse(out)

    return [
        Route("/api/v1/replicas", replicas),
        Route("/api/v1/weights/collect", collect, methods=["POST"]),
        Route("/api/v1/nodes/{node_id}/shards", start_shard, methods=["POST"]),
        Route("/api/v1/nodes/{node_id}/shards/{replica_id}", stop_shard, methods=["DELETE"]),
        Route("/api/v1/nodes/{node_id}/logs", logs),
        Route("/api/v1/weights", weights),
    ]
