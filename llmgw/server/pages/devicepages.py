"""``/admin/device``: where a person approves ``llmgw login`` (``people/devicelogin.py``).

ctl prints a link with its code; the person, signed in as themselves, sees the code, what
asked and from which address, and approves or denies it with a POST that carries the
page's CSRF token (``Frame``). Any person signed in may: the token ctl then gets acts as
them, with no more rights than their own.
"""

from __future__ import annotations

from starlette.responses import Response

from llmgw.server.pages.frame import Frame, Page, PageCall
from llmgw.server.people.devicelogin import DeviceLogins
from llmgw.server.refusal import Refusal


def pages(frame: Frame, logins: DeviceLogins) -> list[Page]:
    async def show(call: PageCall) -> Response:
        typed = call.request.query_params.get("code", "").strip()[:20]
        waiting, error = None, None
        if typed:
            try:
                waiting = logins.waiting(typed)
            except Refusal as exc:
                error = exc.message
        return frame.render(
            call.request,
            "device.html",
            call.session,
            status=404 if error else 200,
            code=typed,
            waiting=waiting,
            error=error,
            done=None,
        )

    async def decide(call: PageCall) -> Response:
        typed = call.form.get("code", "").strip()[:20]
        yes = call.form.get("decision") == "approve"
        logins.approve(typed, call.principal, yes)
        return frame.render(
            call.request,
            "device.html",
            call.session,
            code=typed,
            waiting=None,
            error=None,
            done="approved" if yes else "denied",
        )

    return [
        Page("GET", "/admin/device", show, role="member"),
        Page("POST", "/admin/device", decide, role="member"),
    ]
