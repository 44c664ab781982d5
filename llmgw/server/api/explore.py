"""``GET /api/v1/explore`` and ``GET /api/v1/explore/{org}/{repo}``: the hub's
repositories and a repository's file sets, each judged against the nodes as they are
now (``ExploreService``). Operators and admins: the control plane asks the hub for them.
A hub that stalls or answers garbage is a 424 (``hub_timeout``, ``hub_error``)."""

from __future__ import annotations

from llmgw.server.api.routing import Call, Op, Ops
from llmgw.server.catalog.explore import ExploreService
from llmgw.server.requests import ExploreQuery

LISTING = {
    "type": "object",
    "required": ["hub", "query", "sort", "fits_only", "gguf_only", "judged_by", "listed", "repos"],
}
REPOSITORY = {
    "type": "object",
    "required": ["hub", "repo", "parameters", "judged_by", "sets", "note"],
}


def routes(explore: ExploreService) -> Ops:
    async def listing(call: Call[None, ExploreQuery]) -> object:
        return await explore.explore(call.query)

    async def repository(call: Call[None, None]) -> object:
        return await explore.repository(f"{call.params['org']}/{call.params['repo']}")

    return [
        Op(
            "GET",
            "/api/v1/explore",
            listing,
            "The hub's trending or searched models, each judged against the nodes now",
            access="operator",
            query=ExploreQuery,
            answer=LISTING,
            errors=(424,),
        ),
        Op(
            "GET",
            "/api/v1/explore/{org}/{repo}",
            repository,
            "A hub repository's file sets, each judged against the nodes now",
            access="operator",
            answer=REPOSITORY,
            errors=(400, 404, 424),
        ),
    ]
