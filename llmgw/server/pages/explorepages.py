"""The Explore pages (``/admin/explore``, ``/admin/explore/{org}/{repo}``): the hub's
trending or searched models, each judged against the nodes as they are now, and a
repository's file sets with a Serve button on each that fits (the serve form's own
``POST /admin/models``: the same checks as ``ctl model serve``).

Operators and admins: the control plane asks the hub for them. A hub that stalls or
answers garbage is said on the page, which renders with what it judged by.
"""

from __future__ import annotations

from starlette.responses import Response

from llmgw.server import schema
from llmgw.server.catalog.explore import HUB_FAILED, ExploreService
from llmgw.server.pages.frame import Frame, Page, PageCall
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ExploreQuery

# What the list's form sends; anything else in the query is left out.
FIELDS = ("q", "fits", "sort")


def pages(frame: Frame, explore: ExploreService) -> list[Page]:
    async def listing(call: PageCall) -> Response:
        asked = {k: v for k, v in call.request.query_params.items() if k in FIELDS and v}
        ask = schema.read_query(ExploreQuery, asked)
        found, error = None, None
        try:
            found = await explore.explore(ask)
        except Refusal as exc:
            if exc.status != HUB_FAILED:
                raise
            error = exc.message
        return frame.render(
            call.request,
            "explore.html",
            call.session,
            ask=ask,
            found=found,
            error=error,
            judged_by=found["judged_by"] if found else explore.fleet().judged_by,
        )

    async def repository(call: PageCall) -> Response:
        repo = f"{call.params['org']}/{call.params['repo']}"
        found, error = None, None
        try:
            found = await explore.repository(repo)
        except Refusal as exc:
            if exc.status != HUB_FAILED:
                raise
            error = exc.message
        return frame.render(
            call.request,
            "explore_repo.html",
            call.session,
            repo=repo,
            found=found,
            error=error,
            judged_by=found["judged_by"] if found else explore.fleet().judged_by,
        )

    return [
        Page("GET", "/admin/explore", listing, role="operator"),
        Page("GET", "/admin/explore/{org}/{repo}", repository, role="operator"),
    ]
