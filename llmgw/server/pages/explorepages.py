"""The Explore pages (``/admin/explore``, ``/admin/explore/{org}/{repo}``): the hub's
trending or searched models, each judged against the nodes as they are now, and a
repository's file sets with a Serve button on each that fits (the serve form's own
``POST /admin/models``: the same checks as ``ctl model serve``).

Operators and admins: the control plane asks the hub for them. A hub that stalls or
answers garbage is said on the page, which renders with what it judged by.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.responses import Response

from llmgw.server import schema
from llmgw.server.catalog.explore import HUB_FAILED, ExploreService
from llmgw.server.pages.frame import Frame, Page, PageCall
from llmgw.server.refusal import Refusal
from llmgw.server.requests import ExploreQuery
from llmgw.wire.admin.explore import ExploreJson, ExploreRepoJson

# What the list's form sends; anything else in the query is left out.
FIELDS = ("q", "fits", "sort")


def pages(frame: Frame, explore: ExploreService) -> list[Page]:
    async def render(
        call: PageCall,
        template: str,
        asking: Awaitable[ExploreJson | ExploreRepoJson],
        ask: ExploreQuery | None = None,
        repo: str | None = None,
    ) -> Response:
        """The page with what the hub answered, or with why it did not (still rendered,
        with what it judges by)."""
        found: ExploreJson | ExploreRepoJson | None = None
        error = None
        try:
            found = await asking
        except Refusal as exc:
            if exc.status != HUB_FAILED:
                raise
            error = exc.message
        return frame.render(
            call.request,
            template,
            call.session,
            found=found,
            error=error,
            judged_by=found["judged_by"] if found else explore.fleet().judged_by,
            ask=ask,
            repo=repo,
        )

    async def listing(call: PageCall) -> Response:
        asked = {k: v for k, v in call.request.query_params.items() if k in FIELDS and v}
        ask = schema.read_query(ExploreQuery, asked)
        return await render(call, "explore.html", explore.explore(ask), ask=ask)

    async def repository(call: PageCall) -> Response:
        repo = f"{call.params['org']}/{call.params['repo']}"
        return await render(call, "explore_repo.html", explore.repository(repo), repo=repo)

    return [
        Page("GET", "/admin/explore", listing, role="operator"),
        Page("GET", "/admin/explore/{org}/{repo}", repository, role="operator"),
    ]
