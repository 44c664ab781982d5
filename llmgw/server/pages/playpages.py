"""The playground: chat with a model through ``/v1``, as a client would.

The page itself is only the frame and the words: its script (``static/playground.js``)
asks ``/v1/models`` with a gateway key the user pastes, and streams
``/v1/chat/completions`` with it. Keys are stored hashed, so the control plane has none
to offer; the pasted one stays in the page's memory, goes only to ``/v1`` in the
``Authorization`` header, and is never sent to a page, stored or logged.
"""

from __future__ import annotations

from starlette.responses import Response

from llmgw.server.pages.frame import Frame, Page, PageCall

MAX_TOKENS = 256


def pages(frame: Frame) -> list[Page]:
    async def playground(call: PageCall) -> Response:
        return frame.render(call.request, "playground.html", call.session, max_tokens=MAX_TOKENS)

    return [Page("GET", "/admin/playground", playground)]
