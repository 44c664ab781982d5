"""Signing in to the pages through a real OpenID Connect provider: the npm package
``oidc-provider`` on Debian's nodejs (tests/support/oidcprovider.py, one per run), a real
control plane set up with ``ctl auth oidc set``, Playwright with Debian's chromium for the
browser's way, and an HTTP client for the refusals (a wrong state, a replayed code, a
token from another issuer, an expired ID token, the provider down).

The provider knows alice (groups eng, ops) and bob (eng). The maps: eng gives member of
team acme/ml, ops the cluster's operator role, leads admin of organisation acme.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.catalog import ctl, ctl_json
from tests.e2e.cluster import Cluster, free_port
from tests.support.browser import launched
from tests.support.oidcprovider import CLIENT_ID, PEOPLE, Provider, started

pytestmark = pytest.mark.e2e

MAPS = ["eng=acme/ml:member", "ops=cluster:operator", "leads=acme:admin"]
SCOPES = "openid profile email groups"
STALE = "was not started here, was already used, or took too long"
UNCHECKED = "did not check out"
REFUSED = "did not sign you in"


@pytest.fixture(scope="session")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    root = tmp_path_factory.mktemp("idp")
    with started(root, free_port(), "idp-client-" + secrets.token_urlsafe(16)) as provider:
        yield provider


def set_oidc(cp: Cluster, idp: Provider, issuer: str | None = None) -> Any:
    secret_file = cp.root / "client-secret"
    secret_file.write_text(idp.client_secret + "\n")
    args = ["auth", "oidc", "set", "--issuer", issuer or idp.base, "--client-id", CLIENT_ID]
    args += ["--client-secret-file", str(secret_file), "--scopes", SCOPES]
    for m in MAPS:
        args += ["--map", m]
    return ctl_json(cp, *args)


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory, idp: Provider) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("oidc"))
    cluster.init()
    cluster.start_server()
    try:
        cluster.api("/api/v1/orgs", body={"name": "acme"})
        cluster.api("/api/v1/orgs/acme/teams", body={"name": "ml"})
        set_oidc(cluster, idp)
        yield cluster
    finally:
        cluster.stop()


def server_log(cp: Cluster) -> str:
    assert cp.server is not None
    return cp.server.text()


def person(cp: Cluster, login: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.api(f"/api/v1/people/{login}")
    return found


def roles_of(cp: Cluster, login: str) -> dict[str, str]:
    """Where a person belongs: ``acme`` or ``acme/ml`` to their role."""
    members = cp.api("/api/v1/orgs/acme/members")
    out: dict[str, str] = {}
    for m in members:
        if m["login"] == login:
            out["acme" if m["kind"] == "org" else f"acme/{m['scope_name']}"] = m["role"]
    return out


def to_callback(cp: Cluster, login: str, client: httpx.Client) -> str:
    """Start a sign-in at the control plane and sign in at the provider: the callback
    URL the provider sends the browser back to (not yet followed)."""
    base = f"http://{cp.listen}"
    answer = client.get(f"{base}/admin/login/oidc")
    assert answer.status_code == 303, answer.text
    for _ in range(10):
        location = answer.headers["location"]
        if location.startswith(f"{base}/admin/login/oidc/callback"):
            return location
        url = httpx.URL(str(answer.url)).join(location)
        answer = client.get(url)
        if answer.status_code == 200 and "Test IdP sign-in" in answer.text:
            answer = client.post(url, data={"login": login, "password": PEOPLE[login]})
        assert answer.status_code in (302, 303), (answer.status_code, answer.text[:500])
    raise AssertionError("the provider never sent the browser back")


def with_query(url: str, **change: str | None) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    for key, value in change.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return parts._replace(query=urlencode(query)).geturl()


def sign_in_http(cp: Cluster, login: str) -> httpx.Response:
    with httpx.Client(timeout=20) as client:
        return client.get(to_callback(cp, login, client))


# ------------------------------------------------------------------- settings


def test_the_settings_never_show_the_secret_and_refuse_what_does_not_exist(
    cp: Cluster, idp: Provider
) -> None:
    shown = ctl_json(cp, "auth", "oidc", "show")
    assert shown["enabled"] and shown["issuer"] == idp.base
    assert shown["client_secret"] == "set"
    assert {(m["group"], m["target"], m["role"]) for m in shown["maps"]} == {
        ("eng", "acme/ml", "member"),
        ("ops", "cluster", "operator"),
        ("leads", "acme", "admin"),
    }
    assert idp.client_secret not in ctl(cp, "auth", "oidc", "show").stdout
    secret_file = cp.root / "client-secret"
    for bad, said in [
        ("x=nosuch:member", "no organisation 'nosuch'"),
        ("x=acme/nosuch:member", "acme has no team 'nosuch'"),
        ("x=cluster:member", "a cluster role is one of"),
        ("x=acme:operator", "a role in an organisation or team is one of"),
        ("no-equals-sign", "is not GROUP=cluster:ROLE"),
    ]:
        out = ctl(
            cp, "auth", "oidc", "set", "--issuer", idp.base, "--client-id", CLIENT_ID,
            "--client-secret-file", str(secret_file), "--map", bad, check=False,
        )  # fmt: skip
        assert out.returncode == 1 and said in out.stderr, out.stderr
    # Refused: nothing changed.
    assert ctl_json(cp, "auth", "oidc", "show") == shown
    # The login page offers the provider.
    page = httpx.get(f"http://{cp.listen}/admin/login")
    assert f"Sign in with 127.0.0.1:{idp.base.rsplit(':', 1)[1]}" in page.text


# -------------------------------------------------------------------- browser


def test_a_browser_signs_in_and_the_groups_change_at_the_next_sign_in(
    cp: Cluster, idp: Provider
) -> None:
    base = f"http://{cp.listen}"

    def browser_sign_in(login: str) -> None:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{base}/admin")
        assert "/admin/login" in page.url
        page.click("#oidc")
        page.fill("#login", login)
        page.fill("#password", PEOPLE[login])
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/admin")
        expect(page.locator(".who")).to_contain_text(f"Signed in as {login}")
        context.close()

    idp.set_groups("alice", ["eng", "ops"])
    with launched() as browser:
        browser_sign_in("alice")
        alice = person(cp, "alice")
        assert alice["source"] == "oidc" and alice["email"] == "alice@example.test"
        assert alice["role"] == "operator" and not alice["role_by_hand"]
        assert roles_of(cp, "alice") == {"acme/ml": "member"}

        # The provider moves her from eng and ops to leads: at her next sign-in the
        # groups' grants follow (none of hers was set by hand).
        idp.set_groups("alice", ["leads"])
        browser_sign_in("alice")
        alice = person(cp, "alice")
        assert alice["role"] is None
        assert roles_of(cp, "alice") == {"acme": "admin"}

    # bob: an admin makes him manager of ml by hand, and a viewer of the cluster; his
    # groups (eng: member of ml) never lower either.
    idp.set_groups("bob", ["eng"])
    assert sign_in_http(cp, "bob").status_code == 200
    assert roles_of(cp, "bob") == {"acme/ml": "member"}
    cp.api("/api/v1/orgs/acme/members", body={"person": "bob", "role": "manager", "team": "ml"})
    cp.api("/api/v1/people/bob", body={"role": "viewer"})
    assert sign_in_http(cp, "bob").status_code == 200
    assert roles_of(cp, "bob")["acme/ml"] == "manager"
    assert person(cp, "bob")["role"] == "viewer"
    # A group that gives more raises it: ops makes him an operator.
    idp.set_groups("bob", ["eng", "ops"])
    assert sign_in_http(cp, "bob").status_code == 200
    assert person(cp, "bob")["role"] == "operator"
    assert roles_of(cp, "bob")["acme/ml"] == "manager"
    idp.set_groups("bob", ["eng"])


# ------------------------------------------------------------------- refusals


def test_a_signed_in_person_gets_a_session_of_their_own(cp: Cluster, idp: Provider) -> None:
    idp.set_groups("bob", ["eng"])
    assert sign_in_http(cp, "bob").status_code == 200
    cp.api("/api/v1/people/bob", body={"role": "viewer"})
    with httpx.Client(timeout=20) as client:
        answer = client.get(to_callback(cp, "bob", client))
        assert answer.status_code == 200 and "Signed in as bob." in answer.text
        assert client.cookies.get("llmgw_session", path="/admin")
        me = client.get(f"http://{cp.listen}/admin/keys")
        assert me.status_code == 200
        assert "Signed in as bob" in me.text


def test_a_wrong_state_is_refused(cp: Cluster) -> None:
    with httpx.Client(timeout=20) as client:
        back = to_callback(cp, "bob", client)
        answer = client.get(with_query(back, state="not-the-state"))
    assert answer.status_code == 401 and STALE in answer.text
    assert "llmgw_session" not in answer.cookies
    assert "the state sent back is not the one this sign-in sent" in server_log(cp)


def test_a_replayed_code_is_refused(cp: Cluster) -> None:
    with httpx.Client(timeout=20) as client:
        back = to_callback(cp, "bob", client)
        pending = client.cookies.get("llmgw_oidc")
        assert pending
        assert client.get(back).status_code == 200
        # The same answer again, with its sign-in cookie: its state was taken.
        client.cookies.set("llmgw_oidc", pending, path="/admin/login/oidc")
        again = client.get(back)
        assert again.status_code == 401 and STALE in again.text
    # The old code with a new sign-in's state: the provider takes each code once.
    with httpx.Client(timeout=20) as client:
        fresh = to_callback(cp, "bob", client)
        code = dict(parse_qsl(urlsplit(back).query))["code"]
        replayed = client.get(with_query(fresh, code=code))
    assert replayed.status_code == 401 and REFUSED in replayed.text
    assert "the token request was refused: invalid_grant" in server_log(cp)


def test_a_token_from_another_issuer_is_refused(cp: Cluster, idp: Provider) -> None:
    # Set to trust idp.liar, whose discovery points at idp: its tokens name idp.base.
    set_oidc(cp, idp, issuer=idp.liar)
    try:
        with httpx.Client(timeout=20) as client:
            back = to_callback(cp, "bob", client)
            # The provider says who answered (RFC 9207): refused at once.
            said = client.get(back)
            assert said.status_code == 401 and UNCHECKED in said.text
            # Without that word the ID token itself names the other issuer.
            back = to_callback(cp, "bob", client)
            unsaid = client.get(with_query(back, iss=None))
        assert unsaid.status_code == 401 and UNCHECKED in unsaid.text
        log = server_log(cp)
        assert f"the answer came from issuer '{idp.base}'" in log
        assert f"the ID token's claim is wrong: iss '{idp.base}'" in log
    finally:
        set_oidc(cp, idp)


def test_an_expired_id_token_is_refused(cp: Cluster, idp: Provider) -> None:
    with httpx.Client(timeout=20) as client:
        back = to_callback(cp, "bob", client)
        # The provider's clock two hours behind: the ID token it signs now ended an
        # hour ago.
        idp.skew(-7200)
        try:
            answer = client.get(back)
        finally:
            idp.skew(0)
    assert answer.status_code == 401 and UNCHECKED in answer.text
    assert "the ID token has expired" in server_log(cp)


def test_the_provider_down_is_said_and_turkish_too(cp: Cluster, idp: Provider) -> None:
    set_oidc(cp, idp, issuer=f"http://127.0.0.1:{free_port()}")
    try:
        answer = httpx.get(f"http://{cp.listen}/admin/login/oidc")
        assert answer.status_code == 503
        assert "could not be reached" in answer.text
        turkish = httpx.get(f"http://{cp.listen}/admin/login/oidc", cookies={"llmgw_lang": "tr"})
        assert "Kimlik sağlayıcısına ulaşılamadı" in turkish.text
    finally:
        set_oidc(cp, idp)


def test_a_deactivated_person_is_refused(cp: Cluster) -> None:
    assert sign_in_http(cp, "bob").status_code == 200
    cp.api("/api/v1/people/bob", body={"active": False})
    try:
        answer = sign_in_http(cp, "bob")
        assert answer.status_code == 401 and "deactivated" in answer.text
    finally:
        cp.api("/api/v1/people/bob", body={"active": True})


def test_off_takes_the_button_away(cp: Cluster, idp: Provider) -> None:
    try:
        assert ctl_json(cp, "auth", "oidc", "off")["enabled"] is False
        page = httpx.get(f"http://{cp.listen}/admin/login")
        assert 'id="oidc"' not in page.text
        answer = httpx.get(f"http://{cp.listen}/admin/login/oidc")
        assert answer.status_code == 404 and "not set up" in answer.text
    finally:
        set_oidc(cp, idp)


def test_no_secret_in_any_answer_or_log_line(cp: Cluster, idp: Provider) -> None:
    """Last: every sign-in above has run. The client secret, the codes and the tokens
    the provider handed out appear in no log line and no answer."""
    with httpx.Client(timeout=20) as client:
        back = to_callback(cp, "bob", client)
        code = dict(parse_qsl(urlsplit(back).query))["code"]
        answer = client.get(back)
        assert answer.status_code == 200
        shown = client.get(
            f"http://{cp.listen}/api/v1/auth/oidc",
            headers={"authorization": f"Bearer {cp.admin_token}"},
        )
    assert shown.json()["client_secret"] == "set"
    log = server_log(cp)
    assert "signed in through OIDC" in log  # the log is the one written
    for secret in (idp.client_secret, code):
        assert secret not in log
        assert secret not in shown.text
        assert secret not in answer.text
    # The store keeps the secret sealed.
    for path in Path(cp.data_dir).rglob("*"):
        if path.is_file():
            assert idp.client_secret.encode() not in path.read_bytes(), path
