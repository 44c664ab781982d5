"""``/api/v1/engines``: the engines the fleet runs (``ctl engines``), and each node's
build choice (``ctl engine-build``)."""

from __future__ import annotations

from typing import cast

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.fleet.engines import FleetEngines
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.refusal import Refusal
from llmgw.server.requests import EngineBuild, EngineSet
from llmgw.wire.admin import EnginesJson

DOC = {"type": "object", "required": ["version", "engines", "builds", "nodes"]}


def routes(engines: FleetEngines, registry: NodeRegistry) -> Ops:
    def shown() -> EnginesJson:
        # FleetEngines writes the document and each node's rows (fleet/engines.py);
        # tests/server/api/test_answer_shapes.py holds them to EnginesJson.
        document = {**engines.document(), "nodes": engines.nodes(registry.nodes.values())}
        return cast(EnginesJson, document)

    async def get(call: Call[None, None]) -> EnginesJson:
        return shown()

    async def put(call: Call[EngineSet, None]) -> EnginesJson:
        await engines.ask(call.body, call.principal)
        return shown()

    async def build(call: Call[EngineBuild, None]) -> EnginesJson:
        node = call.params["node_id"]
        if node not in registry.nodes:
            raise Refusal(404, "not_found", f"no node {node!r}; `llmgw ctl nodes` lists them")
        await engines.ask_build(node, call.body, call.principal)
        return shown()

    async def history(call: Call[None, None]) -> object:
        return await engines.history()

    return [
        Op(
            "GET",
            "/api/v1/engines/history",
            history,
            "Every change of the fleet's engines and nodes' builds, newest first",
            answer={"type": "array", "items": {"type": "object"}},
        ),
        Op(
            "GET",
            "/api/v1/engines",
            get,
            "The engines the fleet runs, and every node's standing with each",
            answer=DOC,
        ),
        Op(
            "POST",
            "/api/v1/engines",
            put,
            "Name an engine's version for the fleet (audited; agents converge)",
            body=EngineSet,
            answer=DOC,
            access="admin",
        ),
        Op(
            "POST",
            "/api/v1/nodes/{node_id}/engine-build",
            build,
            "Which build of the engines a node installs (auto, cu13, cu129, cpu, none)",
            body=EngineBuild,
            answer=DOC,
            errors=(404,),
        ),
    ]
