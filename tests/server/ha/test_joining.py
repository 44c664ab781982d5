"""A new control plane's join, as the leader answers it (in process, no sockets): a
token of the right kind, unused, unexpired and proven is let in once; every other one
is refused saying which. And the kernel pieces it stands on: server tokens, peer
certificates, the sealed bundle."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw import jointoken, pki
from llmgw.server.app import ControlPlane
from llmgw.server.datadir import DataDir, init
from llmgw.server.principal import Principal
from llmgw.server.store import open_store

ADMIN = Principal("admin@test", "admin", "token")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # Nothing listens: the app is called in process.
    init(
        tmp_path / "data", listen="127.0.0.1:1", agent_port=2, advertise=["127.0.0.1"], name="cp-a"
    )
    return tmp_path / "data"


@pytest.fixture
async def cp(root: Path) -> AsyncIterator[ControlPlane]:
    data = DataDir(root)
    config = data.load_config()
    store = await open_store(config, root)
    plane = ControlPlane(data, config, store)
    await plane.load()
    await plane.ha.reload_servers()
    try:
        yield plane
    finally:
        await plane.gateway.close()
        await plane.inspector.close()
        await plane.ha.client.close()
        await store.close()


def ask(token: jointoken.JoinToken, name: str = "cp-b") -> tuple[dict[str, Any], bytes]:
    key_pem, csr_pem = pki.make_csr(pki.PEER_PREFIX + name)
    body = {
        "token_id": token.id,
        "name": name,
        "csr": csr_pem.decode(),
        "api_address": "127.0.0.1:9080",
        "agent_address": "127.0.0.1:9443",
        "peer_address": "127.0.0.1:9444",
        "sans": ["127.0.0.1", "cp-b.example"],
        "mac": jointoken.join_mac(token.secret, name, csr_pem),
    }
    return body, key_pem


async def join(cp: ControlPlane, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        return await client.post("/api/v1/servers/join", json=body)


async def test_a_server_token_lets_one_control_plane_in_with_the_clusters_secrets(
    cp: ControlPlane,
) -> None:
    token = await cp.tokens.mint(600, ADMIN, server=True)
    assert token.encode().startswith(jointoken.SERVER_PREFIX)
    body, key_pem = ask(token)
    answer = await join(cp, body)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    cert, ca = got["cert"].encode(), got["ca"].encode()
    import base64

    sealed = base64.b64decode(got["sealed"])
    # The leader proves it holds the token, over everything it answered.
    assert jointoken.check(jointoken.joined_mac(token.secret, cert, ca, sealed), got["mac"])
    assert pki.verify_issued_by(cert, ca) and pki.cert_matches_key(cert, key_pem)
    assert pki.cert_common_name(cert) == "llmgw-server:cp-b"
    # The bundle opens only with the token, for this name and CSR: the cluster's secret
    # and CA key, the same bytes the leader holds.
    import msgpack

    context = b"llmgw server join\x00cp-b\x00" + body["csr"].encode()
    bundle = msgpack.unpackb(pki.open_for_token(token.secret, context, sealed))
    assert bundle["cluster_key"] == cp.cluster_secret
    assert bundle["ca_key"] == cp.ca.key_pem
    with pytest.raises(pki.PKIError):
        pki.open_for_token(token.secret, context + b"x", sealed)
    # Recorded, and its certificate opens the control planes' link.
    servers = {s.name: s for s in await cp.store.list_servers()}
    assert servers["cp-b"].peer_address == "127.0.0.1:9444"
    assert cp.ha.peer_ok("cp-b", pki.cert_serial(cert))
    assert not cp.ha.peer_ok("cp-b", pki.cert_serial(cert) + 1)
    # Used once: the same token again is refused, naming who used it.
    again = await join(cp, ask(token, "cp-c")[0])
    assert again.status_code == 403
    assert again.json()["error"]["type"] == "token_used"
    assert "control plane 'cp-b'" in again.json()["error"]["message"]


@pytest.mark.parametrize("fault", ["forged", "altered", "expired", "node_token", "name_taken"])
async def test_a_bad_server_token_is_refused_saying_which(cp: ControlPlane, fault: str) -> None:
    token = await cp.tokens.mint(600, ADMIN, server=True)
    name = "cp-b"
    if fault == "forged":
        token = dataclasses.replace(token, id="s-0000000000000000")
    elif fault == "altered":
        token = dataclasses.replace(token, secret=b"x" * 32)
    elif fault == "expired":
        token = await cp.tokens.mint(1, ADMIN, server=True)
        record = await cp.store.get_join_token(token.id)
        assert record is not None
        await cp.store.db.execute("UPDATE join_tokens SET expires_at = 1 WHERE id = ?", (token.id,))
        await cp.store.db.commit()
    elif fault == "node_token":
        token = await cp.tokens.mint(600, ADMIN)
    elif fault == "name_taken":
        name = "cp-a"  # the leader's own
        await cp.ha._enter()
    answer = await join(cp, ask(token, name)[0])
    error = answer.json()["error"]
    expected = {
        "forged": (403, "token_forged", "not issued by this control plane"),
        "altered": (403, "token_forged", "does not match"),
        "expired": (403, "token_expired", "expired at"),
        "node_token": (403, "token_kind", "a node's"),
        "name_taken": (409, "server_exists", "already part of the cluster"),
    }[fault]
    assert (answer.status_code, error["type"]) == expected[:2], answer.text
    assert expected[2] in error["message"]
    assert "cp-b" not in {s.name for s in await cp.store.list_servers()}


async def test_a_server_token_does_not_enroll_a_node(cp: ControlPlane) -> None:
    token = await cp.tokens.mint(600, ADMIN, server=True)
    _, csr = pki.make_csr("n1")
    body = {
        "token_id": token.id,
        "node_id": "n1",
        "csr": csr.decode(),
        "mac": jointoken.enroll_mac(token.secret, "n1", csr),
    }
    transport = httpx.ASGITransport(app=cp.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        answer = await client.post("/api/v1/enroll", json=body)
    assert answer.status_code == 403
    assert answer.json()["error"]["type"] == "token_kind"
    assert await cp.store.get_node("n1") is None


def test_each_kind_of_token_is_refused_where_the_other_is_expected() -> None:
    token = jointoken.JoinToken("s-abc", b"k" * 32, ["h:1"], "f" * 64, 9e9)
    text = token.encode()
    assert jointoken.parse(text, server=True) == token
    with pytest.raises(jointoken.TokenError, match="llmgw server join"):
        jointoken.parse(text)
    node = jointoken.JoinToken("abc", b"k" * 32, ["h:1"], "f" * 64, 9e9).encode()
    with pytest.raises(jointoken.TokenError, match="a node's"):
        jointoken.parse(node, server=True)


def test_a_peer_certificate_serves_and_connects_and_names_a_control_plane() -> None:
    ca = pki.make_ca("test")
    pair = pki.make_peer_cert(ca, "cp-a", ["127.0.0.1", "cp-a.example"])
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "llmgw-server:cp-a" and pki.peer_name(str(cn)) == "cp-a"
    # A node id cannot hold ':', so no node's certificate names a control plane.
    assert pki.peer_name("n1") is None
