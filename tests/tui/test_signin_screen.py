"""The console's Sign-in screen against a real control plane on loopback, driven by
Pilot: the cluster's admin sees OIDC, LDAP and SCIM as the admin API shows them (never
a secret) and turns LDAP off; a viewer is told the screen is the admins', and the
turn-off they send anyway is refused by the API, which changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from textual.widgets import Button, DataTable, Static

from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.tui.api import ConsoleApi, refused
from llmgw.tui.app import ConsoleApp
from llmgw.tui.dialogs import ConfirmDialog
from tests.e2e.cluster import Cluster
from tests.tui.test_people_screens import personal_token, rows, text, until

pytestmark = pytest.mark.e2e

CLIENT_SECRET = "oidc-client-secret-Hk30"
BIND_PASSWORD = "ldap-bind-password-Pq19"


@dataclass
class Ready:
    cluster: Cluster
    # SCIM's token, made when the cluster was.
    scim_token: str


@pytest.fixture
def ready(tmp_path: Path) -> Iterator[Ready]:
    """A control plane with all three ways in set, and vic, a viewer."""
    c = Cluster(tmp_path)
    c.init()
    c.start_server()
    try:
        c.api("/api/v1/people", body={"login": "vic", "role": "viewer"})
        c.api(
            "/api/v1/auth/oidc",
            body={
                "client_id": "llmgw-cluster",
                "client_secret": CLIENT_SECRET,
                "issuer": "https://idp.example.com/realms/acme",
                "maps": ["gpu-admins=cluster:admin"],
            },
        )
        c.api(
            "/api/v1/auth/ldap",
            body={
                "url": "ldap://127.0.0.1:1",
                "bind_dn": "cn=llmgw,dc=example,dc=com",
                "base_dn": "dc=example,dc=com",
                "bind_password": BIND_PASSWORD,
            },
        )
        c.api("/api/v1/auth/scim/maps", body={"maps": ["ops=cluster:operator"]})
        yield Ready(c, c.api("/api/v1/auth/scim/token", body={})["token"])
    finally:
        c.stop()


async def test_the_admin_sees_all_three_and_turns_ldap_off(ready: Ready) -> None:
    cluster = ready.cluster
    secrets = (CLIENT_SECRET, BIND_PASSWORD, ready.scim_token)
    app = ConsoleApp(ConsoleApi(AdminClient(f"http://{cluster.listen}", cluster.admin_token)), 0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.people, "the first snapshot")
        await pilot.press("i")
        assert app.current.ID == "signin"
        table = app.query_one("#signin-table", DataTable)
        await until(pilot, lambda: table.row_count == 3, "the three rows")
        shown = {r[0]: r for r in rows(table)}
        assert [shown[n][1] for n in ("OIDC / Entra ID", "LDAP / AD", "SCIM")] == ["on"] * 3
        assert "https://idp.example.com/realms/acme" in shown["OIDC / Entra ID"][2]
        assert "secret set" in shown["OIDC / Entra ID"][2]
        assert "ldap://127.0.0.1:1" in shown["LDAP / AD"][2]
        assert shown["LDAP / AD"][4].endswith(" by admin@127.0.0.1")
        assert shown["SCIM"][3] == "1"
        detail = app.query_one("#signin-detail", Static)
        table.move_cursor(row=0)
        await until(pilot, lambda: "gpu-admins=cluster:admin" in text(detail), "OIDC's maps")
        for row in rows(table):
            assert not any(s in cell for s in secrets for cell in row)
        # Turn LDAP off: asked first, then the row says off.
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("o")
        assert isinstance(app.screen, ConfirmDialog)
        app.screen.query_one("#confirm", Button).focus()
        await pilot.press("enter")
        await until(
            pilot,
            lambda: [r for r in rows(table) if r[0] == "LDAP / AD" and r[1] == "off"],
            "LDAP off",
        )
    assert cluster.api("/api/v1/auth/ldap")["enabled"] is False
    assert cluster.api("/api/v1/auth/oidc")["enabled"] is True


async def test_a_viewer_is_told_and_the_api_refuses_their_turn_off(ready: Ready) -> None:
    cluster = ready.cluster
    api = ConsoleApi(AdminClient(f"http://{cluster.listen}", personal_token(cluster, "vic")))
    app = ConsoleApp(api, 0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot.people, "the first snapshot")
        await pilot.press("i")
        detail = app.query_one("#signin-detail", Static)
        await until(pilot, lambda: "need the cluster's admin role" in text(detail), "refusal")
        assert app.query_one("#signin-table", DataTable).row_count == 0
    for way in ("oidc", "ldap", "scim"):
        with pytest.raises(AdminError) as caught:
            await api.signin_off(way)
        assert refused(caught.value), way
    assert cluster.api("/api/v1/auth/ldap")["enabled"] is True
    assert cluster.api("/api/v1/auth/oidc")["enabled"] is True
    assert cluster.api("/api/v1/auth/scim")["token"] == "set"
