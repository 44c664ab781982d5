"""The Sign-in page (``/admin/signin``, the cluster's admins'): OpenID Connect (or
Entra ID), LDAP / Active Directory and SCIM side by side, each on or off, its settings
without a secret, its group maps, and when it last changed and by whom; and the forms
that turn each off, try LDAP for a login step by step, make SCIM's token (shown on the
answer page, that once) and set SCIM's group maps.

Setting OIDC and LDAP stays with ``llmgw ctl auth``: no form here carries a secret.
Every page and form is ``admin`` at the gate, and ``SignIns`` checks again.
"""

from __future__ import annotations

from starlette.responses import RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.ldap.service import LdapTest
from llmgw.server.pages.frame import Frame, Page, PageCall
from llmgw.server.people.signins import WAYS, SignIns, Way
from llmgw.server.refusal import Refusal
from llmgw.wire.admin.ldap import LdapTestJson

HOME = "/admin/signin"


def way_of(text: str) -> Way:
    for way in WAYS:
        if way == text:
            return way
    raise Refusal(404, "not_found", f"no sign-in {text!r}: oidc, ldap or scim")


def map_lines(text: str) -> list[str]:
    """SCIM's maps as typed: one a line, blank lines left out."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def pages(frame: Frame, signins: SignIns) -> list[Page]:
    async def show(
        call: PageCall,
        made: str | None = None,
        tested: LdapTestJson | None = None,
        tested_login: str = "",
    ) -> Response:
        shown = await signins.shown(call.principal)
        return frame.render(
            call.request,
            "signin.html",
            call.session,
            made=made,
            tested=tested,
            tested_login=tested_login,
            **shown,
        )

    async def overview(call: PageCall) -> Response:
        return await show(call)

    async def off(call: PageCall) -> Response:
        await signins.off(way_of(str(call.params["way"])), call.principal)
        return RedirectResponse(HOME, status_code=303)

    async def ldap_test(call: PageCall) -> Response:
        body: dict[str, object] = {"login": call.form.get("login", "").strip()}
        password = call.form.get("password", "")
        if password:
            body["password"] = password
        tested = await signins.test_ldap(schema.read(LdapTest, body), call.principal)
        # The password is never drawn back: the form comes back empty.
        return await show(call, tested=tested, tested_login=str(body["login"]))

    async def scim_token(call: PageCall) -> Response:
        token = await signins.new_scim_token(call.principal)
        # In this one answer and nowhere else: never in a redirect or a later page.
        return await show(call, made=token)

    async def scim_maps(call: PageCall) -> Response:
        await signins.set_scim_maps(map_lines(call.form.get("maps", "")), call.principal)
        return RedirectResponse(HOME, status_code=303)

    return [
        Page("GET", HOME, overview, role="admin"),
        Page("POST", HOME + "/{way}/off", off, role="admin"),
        Page("POST", HOME + "/ldap/test", ldap_test, role="admin"),
        Page("POST", HOME + "/scim/token", scim_token, role="admin"),
        Page("POST", HOME + "/scim/maps", scim_maps, role="admin"),
    ]
