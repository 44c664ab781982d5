"""The OIDC (and Entra ID) sign-in settings through the admin API of a real control plane,
in process: the secret sealed in the store and never shown, group maps checked against
the organisations and teams that exist, a cluster admin's alone, read by another control
plane from the same store. The sign-in itself, against a real provider, is
tests/e2e/test_oidc.py."""

from __future__ import annotations

import json

import httpx
import pytest

from llmgw import pki
from llmgw.server.app import ControlPlane
from llmgw.server.pages import i18n
from llmgw.server.people import oidcflow
from llmgw.server.people.oidcsettings import SETTING, OidcSettings
from llmgw.server.people.service import Grant
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import StoreUnavailable
from llmgw.wire.admin import OidcJson

Plane = tuple[ControlPlane, httpx.AsyncClient]
SECRET = "very-secret-client-secret-0123456789"


async def make_org(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/v1/orgs", json={"name": "acme"})).status_code == 201
    answer = await client.post("/api/v1/orgs/acme/teams", json={"name": "ml"})
    assert answer.status_code == 201


def oidc_body(**more: object) -> dict[str, object]:
    return {
        "issuer": "https://idp.example.com/realms/acme/",
        "client_id": "llmgw",
        "client_secret": SECRET,
        "maps": ["eng=acme/ml:member", "ops=cluster:operator", "leads=ACME:admin"],
        **more,
    }


async def test_set_seals_the_secret_and_shows_it_only_as_set(plane: Plane) -> None:
    cp, client = plane
    await make_org(client)
    answer = await client.post("/api/v1/auth/oidc", json=oidc_body())
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    assert set(shown) == set(OidcJson.__required_keys__)
    assert shown["enabled"] is True and shown["kind"] == "oidc"
    assert shown["issuer"] == "https://idp.example.com/realms/acme"
    assert shown["client_secret"] == "set"
    assert shown["scopes"] == ["openid", "profile", "email"]
    assert shown["name"] == "idp.example.com"
    assert shown["maps"] == [
        {"group": "eng", "target": "acme/ml", "role": "member"},
        {"group": "ops", "target": "cluster", "role": "operator"},
        {"group": "leads", "target": "acme", "role": "admin"},
    ]
    assert SECRET not in answer.text
    assert (await client.get("/api/v1/auth/oidc")).json() == shown
    raw = await cp.store.get_setting(SETTING)
    assert raw is not None and SECRET not in raw
    sealed = json.loads(raw)["client_secret"]
    assert pki.unseal(cp.cluster_secret, sealed).decode() == SECRET
    audit = await cp.store.audit_log(limit=5)
    assert any(r["action"] == "auth.oidc.set" for r in audit)
    assert all(SECRET not in json.dumps(r) for r in audit)


async def test_another_control_plane_reads_the_same_settings(plane: Plane) -> None:
    cp, client = plane
    await make_org(client)
    assert (await client.post("/api/v1/auth/oidc", json=oidc_body())).status_code == 200
    other = OidcSettings(cp.store, cp.directory, cp.cluster_secret)
    await other.load()
    assert other.view() == cp.oidc.view()
    assert other.client_secret() == SECRET
    org = next(o for o in cp.directory.now.orgs.values() if o.name == "acme")
    team = next(t for t in cp.directory.teams_of(org.id) if t.name == "ml")
    assert other.grants(["eng", "leads", "not-mapped"]) == [
        Grant("member", "team", team.id),
        Grant("admin", "org", org.id),
    ]
    # A standby's store changes: it reads the settings again.
    assert (await client.delete("/api/v1/auth/oidc")).json()["enabled"] is False
    await other.load()
    assert other.current is None and other.grants(["eng"]) == []


async def test_entra_is_oidc_from_a_tenant(plane: Plane) -> None:
    _, client = plane
    body = {"kind": "entra", "tenant": "contoso.onmicrosoft.com", "client_id": "c1"}
    answer = await client.post("/api/v1/auth/oidc", json={**body, "client_secret": SECRET})
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    assert shown["issuer"] == "https://login.microsoftonline.com/contoso.onmicrosoft.com/v2.0"
    assert shown["kind"] == "entra" and shown["name"] == "Microsoft"


@pytest.mark.parametrize(
    ("change", "field", "said"),
    [
        ({"maps": ["x=nosuch:member"]}, "maps", "no organisation 'nosuch'"),
        ({"maps": ["x=acme/nosuch:member"]}, "maps", "acme has no team 'nosuch'"),
        ({"maps": ["x=cluster:manager"]}, "maps", "a cluster role is one of"),
        ({"maps": ["x=acme:operator"]}, "maps", "organisation or team is one of"),
        ({"maps": ["just-a-group"]}, "maps", "is not GROUP=cluster:ROLE"),
        ({"issuer": "not a url"}, "issuer", "is not a URL"),
        ({"issuer": "http://idp.example.com"}, "issuer", "use https"),
        ({"issuer": ""}, "issuer", "give the provider's issuer URL"),
        ({"kind": "entra", "issuer": ""}, "tenant", "needs its tenant"),
        ({"tenant": "t1"}, "tenant", "a tenant is for kind entra"),
        ({"client_secret": "  "}, "client_secret", "give the client's secret"),
    ],
)
async def test_bad_settings_are_refused_naming_the_field_and_change_nothing(
    plane: Plane, change: dict[str, object], field: str, said: str
) -> None:
    cp, client = plane
    await make_org(client)
    answer = await client.post("/api/v1/auth/oidc", json=oidc_body(**change))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert said in error["message"] and error["message"].startswith(field)
    assert cp.oidc.current is None
    assert (await client.get("/api/v1/auth/oidc")).json()["enabled"] is False


async def test_only_a_cluster_admin_reads_or_changes_them(plane: Plane) -> None:
    cp, client = plane
    for role in (None, "viewer", "operator"):
        who = Principal("bob", role, "token", "p1")  # type: ignore[arg-type]
        with pytest.raises(Refusal) as refused:
            cp.oidc.show(who)
        assert refused.value.status == 403
        with pytest.raises(Refusal):
            await cp.oidc.off(who)
    assert cp.oidc.show(Principal("root", "admin", "token"))["enabled"] is False
    # Without the admin token the routes are refused before the service is asked.
    for method in ("GET", "POST", "DELETE"):
        answer = await client.request(method, "/api/v1/auth/oidc", headers={"authorization": ""})
        assert answer.status_code == 401


async def test_the_login_page_offers_the_provider_in_both_languages(plane: Plane) -> None:
    _, client = plane
    page = await client.get("/admin/login", headers={"authorization": ""})
    assert 'id="oidc"' not in page.text
    answer = await client.post("/api/v1/auth/oidc", json=oidc_body(maps=[], name="Acme SSO"))
    assert answer.status_code == 200
    page = await client.get("/admin/login?next=/admin/keys", headers={"authorization": ""})
    assert "Sign in with Acme SSO" in page.text
    assert 'href="/admin/login/oidc?next=/admin/keys"' in page.text
    turkish = await client.get(
        "/admin/login", headers={"authorization": "", "accept-language": "tr"}
    )
    assert "Acme SSO ile oturum aç" in turkish.text


def test_every_sign_in_refusal_has_its_turkish() -> None:
    words = [
        oidcflow.OFF,
        oidcflow.UNREACHABLE,
        oidcflow.STALE,
        oidcflow.REFUSED,
        oidcflow.UNCHECKED,
        oidcflow.DEACTIVATED,
        oidcflow.NO_LOGIN,
        oidcflow.UNRECORDED,
    ]
    assert [w for w in words if w not in i18n.TURKISH] == []


async def test_checked_claims_make_the_person_with_their_groups_grants(plane: Plane) -> None:
    cp, client = plane
    await make_org(client)
    assert (await client.post("/api/v1/auth/oidc", json=oidc_body())).status_code == 200
    oidc = cp.oidc.current
    assert oidc is not None
    claims = {
        "iss": oidc.issuer,
        "sub": "u-1",
        "preferred_username": "Carol",
        "email": "carol@example.test",
        "groups": ["eng", "ops", "unmapped"],
    }
    carol = await cp.oidc_flow.person_of(oidc, claims, "oidc@test")
    assert (carol.login, carol.source, carol.subject) == ("carol", "oidc", f"{oidc.issuer}|u-1")
    assert carol.role == "operator" and not carol.role_by_hand
    [membership] = cp.directory.memberships_of(carol.id)
    assert (membership.kind, membership.role) == ("team", "member")
    # One string for one group is read too; no login at all is refused.
    again = await cp.oidc_flow.person_of(oidc, {**claims, "groups": "leads"}, "oidc@test")
    assert again.id == carol.id and again.role is None
    assert [m.kind for m in cp.directory.memberships_of(carol.id)] == ["org"]
    with pytest.raises(oidcflow.SignInFailed) as failed:
        await cp.oidc_flow.person_of(oidc, {"iss": oidc.issuer, "sub": "u-2"}, "oidc@test")
    assert failed.value.message == oidcflow.NO_LOGIN


async def test_a_store_that_cannot_be_written_is_said(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby (or a store that is down) cannot record a sign-in: the person is told
    to sign in at the leader, with a 503, not a 500."""
    cp, client = plane
    assert (await client.post("/api/v1/auth/oidc", json=oidc_body(maps=[]))).status_code == 200
    oidc = cp.oidc.current
    assert oidc is not None

    async def refuse(*args: object) -> None:
        raise StoreUnavailable("the store is read-only on a standby")

    monkeypatch.setattr(cp.store.directory, "change", refuse)
    claims = {"iss": oidc.issuer, "sub": "u-3", "email": "dan@example.test"}
    with pytest.raises(oidcflow.SignInFailed) as failed:
        await cp.oidc_flow.person_of(oidc, claims, "oidc@test")
    assert failed.value.message == oidcflow.UNRECORDED and failed.value.status == 503
    assert cp.directory.by_login("dan@example.test") is None
