"""The cluster's llmgw releases: which release a new machine gets (``node add``, ``server
add`` fetch it, checked, from where this names) and which llmgw each process runs now
(``llmgw version --cluster``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmgw import __version__
from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.ha.membership import Membership
from llmgw.wire.admin import NodeVersionJson, ReleaseJson, ServerVersionJson, VersionsJson


def routes(
    members: Membership,
    nodes: Callable[[], Iterable[NodeView]],
    source: Callable[[], str],
) -> Ops:
    """``source``: where this cluster's releases come from now (``releases.source``, or
    the control plane's own mirror when the cluster is offline)."""

    async def release(call: Call[None, None]) -> ReleaseJson:
        return {"version": __version__, "source": source()}

    async def versions(call: Call[None, None]) -> VersionsJson:
        return cluster_versions(members, nodes())

    return [
        Op(
            "GET",
            "/api/v1/release",
            release,
            "The llmgw release a new node or control plane gets, and where it comes from",
            answer={"type": "object", "required": ["version", "source"]},
        ),
        Op(
            "GET",
            "/api/v1/versions",
            versions,
            "The llmgw each control plane and each agent runs",
            answer={"type": "object", "required": ["version", "servers", "nodes"]},
        ),
    ]


def cluster_versions(members: Membership, nodes: Iterable[NodeView]) -> VersionsJson:
    servers: list[ServerVersionJson] = []
    for s in members.listing():
        if s["removed_at"] is not None:
            continue
        role, version = s["role"], s["version"]
        servers.append(
            {
                "name": str(s["name"]),
                "role": role if isinstance(role, str) else None,
                "version": version if isinstance(version, str) else None,
                "answers": bool(s["answers"]),
                "this": bool(s["this"]),
            }
        )
    agents: list[NodeVersionJson] = [
        {"id": v.id, "version": v.version or None, "connected": v.session is not None}
        for v in sorted(nodes, key=lambda v: v.id)
    ]
    return {"version": __version__, "servers": servers, "nodes": agents}
