"""``JoinTokens`` over a real SQLite store and a real cluster CA: a token is minted with
its secret sealed and its making audited; an enrollment refuses a bad node id, an
unknown token, a wrong MAC, a token of the other kind, a used one (naming the node that
used it) and an expired one, each saying why; it signs the CSR for the node id, tells
the fleet, is audited under the token, and uses the token once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw import jointoken, pki
from llmgw.server.admission import JoinTokens, new_token_record
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import Enroll
from llmgw.server.store import SQLiteStore

CLUSTER_SECRET = pki.new_secret()
CA = pki.make_ca("test-cluster")
DAVE = Principal("dave@10.0.0.9", "admin", "token")


@dataclass
class Admission:
    tokens: JoinTokens
    store: SQLiteStore
    enrolled: list[tuple[str, int]] = field(default_factory=list)


class RacedStore(SQLiteStore):
    """A store where another node uses each join token just before this one does (two
    enrollments with one token, both checked before either used it)."""

    async def use_join_token(self, token_id: str, node_id: str, at: float) -> bool:
        await super().use_join_token(token_id, "quicker-node", at)
        return await super().use_join_token(token_id, node_id, at)


async def admission(store: SQLiteStore) -> Admission:
    await store.open()
    enrolled: list[tuple[str, int]] = []

    async def tell_fleet(node_id: str, serial: int) -> None:
        enrolled.append((node_id, serial))

    tokens = JoinTokens(
        store,
        CLUSTER_SECRET,
        CA,
        ["10.0.0.1:8080", "10.0.0.2:8080"],
        ["10.0.0.1:8443"],
        tell_fleet,
    )
    return Admission(tokens, store, enrolled)


@pytest.fixture
async def joining(tmp_path: Path) -> AsyncIterator[Admission]:
    made = await admission(SQLiteStore(tmp_path / "store.db"))
    try:
        yield made
    finally:
        await made.store.close()


def enroll_ask(
    token: jointoken.JoinToken, node_id: str, secret: bytes | None = None, cn: str | None = None
) -> Enroll:
    """What ``agent run --token`` posts: a CSR and its MAC under the token's secret."""
    _, csr = pki.make_csr(cn or node_id)
    mac = jointoken.enroll_mac(secret or token.secret, node_id, csr)
    return Enroll(token_id=token.id, node_id=node_id, csr=csr.decode(), mac=mac)


async def refused(joining: Admission, ask: Enroll) -> Refusal:
    with pytest.raises(Refusal) as caught:
        await joining.tokens.enroll(ask)
    return caught.value


# ------------------------------------------------------------------ mint


async def test_a_token_is_minted_with_its_secret_sealed_and_audited(joining: Admission) -> None:
    token = await joining.tokens.mint(600, DAVE)
    assert not token.for_server and len(token.secret) == 32
    assert token.addresses == ["10.0.0.1:8080", "10.0.0.2:8080"]
    assert token.ca_fingerprint == pki.fingerprint(CA.cert_pem)
    record = await joining.store.get_join_token(token.id)
    assert record is not None and record.created_by == "dave@10.0.0.9"
    assert record.expires_at - record.created_at == 600
    assert abs(token.expires_at - record.expires_at) < 1e-6
    # Kept sealed under the cluster secret: not the secret, and only that key opens it.
    assert token.secret.hex() not in record.secret_sealed
    assert pki.unseal(CLUSTER_SECRET, record.secret_sealed) == token.secret
    (entry,) = await joining.store.audit_log()
    assert (entry["actor"], entry["action"], entry["target"], entry["detail"]) == (
        "dave@10.0.0.9",
        "token.create",
        token.id,
        "ttl 600s",
    )


async def test_a_server_token_is_of_its_own_kind(joining: Admission) -> None:
    token = await joining.tokens.mint(60, DAVE, server=True)
    assert token.for_server and token.id.startswith(jointoken.SERVER_ID)
    (entry,) = await joining.store.audit_log()
    assert entry["action"] == "server.token"


# ------------------------------------------------------------------ enroll


async def test_a_node_enrolls_once_with_a_certificate_for_its_id(joining: Admission) -> None:
    token = await joining.tokens.mint(600, DAVE)
    # The CSR names someone else: the certificate is for the node id all the same.
    answer = await joining.tokens.enroll(enroll_ask(token, "gpu-01", cn="not-gpu-01"))
    cert = answer["cert"].encode()
    assert answer["node_id"] == "gpu-01" and pki.cert_common_name(cert) == "gpu-01"
    assert pki.verify_issued_by(cert, CA.cert_pem)
    assert answer["ca"] == CA.cert_pem.decode()
    assert answer["control_planes"] == ["10.0.0.1:8443"]
    # The control plane proves it holds the token too, bound to what it answered.
    assert answer["mac"] == jointoken.answer_mac(token.secret, cert, CA.cert_pem)
    serial = pki.cert_serial(cert)
    assert joining.enrolled == [("gpu-01", serial)]

    record = await joining.store.get_join_token(token.id)
    assert record is not None and record.used_by == "gpu-01" and record.used_at is not None
    entry = (await joining.store.audit_log())[0]
    assert (entry["actor"], entry["action"], entry["target"], entry["detail"]) == (
        f"join token {token.id}",
        "node.enroll",
        "gpu-01",
        f"serial {serial}",
    )

    # Used once: a second node with the same token is told who used it.
    again = await refused(joining, enroll_ask(token, "gpu-02"))
    assert (again.status, again.code) == (403, "token_used")
    assert "already used by node 'gpu-01' at " in again.message
    assert "llmgw node token" in again.message
    assert joining.enrolled == [("gpu-01", serial)]


@pytest.mark.parametrize(
    "node_id", ["-leading-dash", ".hidden", "has space", "a" * 64, "llmgw-server:cp", "ü-node"]
)
async def test_a_bad_node_id_is_refused_before_the_token_is_looked_at(
    joining: Admission, node_id: str
) -> None:
    token = await joining.tokens.mint(600, DAVE)
    refusal = await refused(joining, enroll_ask(token, node_id))
    assert (refusal.status, refusal.code) == (400, "bad_node_id")
    assert repr(node_id) in refusal.message
    record = await joining.store.get_join_token(token.id)
    assert record is not None and record.used_at is None and joining.enrolled == []


async def test_a_good_node_id_of_63_characters_is_taken(joining: Admission) -> None:
    token = await joining.tokens.mint(600, DAVE)
    node_id = "n" + "1._-" * 15 + "ab"
    assert len(node_id) == 63
    answer = await joining.tokens.enroll(enroll_ask(token, node_id))
    assert answer["node_id"] == node_id


async def test_an_unknown_token_or_a_wrong_mac_is_forged(joining: Admission) -> None:
    token = await joining.tokens.mint(600, DAVE)
    foreign = jointoken.JoinToken("0123456789abcdef", token.secret, [], "", token.expires_at)
    unknown = await refused(joining, enroll_ask(foreign, "gpu-01"))
    assert (unknown.status, unknown.code) == (403, "token_forged")
    assert "not issued by this control plane" in unknown.message

    wrong = await refused(joining, enroll_ask(token, "gpu-01", secret=pki.new_secret()))
    assert (wrong.status, wrong.code) == (403, "token_forged")
    assert "does not match" in wrong.message

    # A MAC made for another node id does not pass for this one.
    ask = enroll_ask(token, "gpu-01")
    moved = await refused(
        joining, Enroll(token_id=ask.token_id, node_id="gpu-02", csr=ask.csr, mac=ask.mac)
    )
    assert moved.code == "token_forged"
    record = await joining.store.get_join_token(token.id)
    assert record is not None and record.used_at is None and joining.enrolled == []


async def test_a_control_planes_token_does_not_enroll_a_node(joining: Admission) -> None:
    token = await joining.tokens.mint(600, DAVE, server=True)
    refusal = await refused(joining, enroll_ask(token, "gpu-01"))
    assert (refusal.status, refusal.code) == (403, "token_kind")
    assert "a control plane's" in refusal.message and "llmgw node token" in refusal.message


async def test_an_expired_token_is_refused_with_when_it_expired(joining: Admission) -> None:
    secret = pki.new_secret()
    record = new_token_record(CLUSTER_SECRET, -5, secret, "dave@10.0.0.9")
    await joining.store.add_join_token(record)
    token = jointoken.JoinToken(record.id, secret, [], "", record.expires_at)
    refusal = await refused(joining, enroll_ask(token, "gpu-01"))
    assert (refusal.status, refusal.code) == (403, "token_expired")
    assert "expired at " in refusal.message and " UTC" in refusal.message
    assert joining.enrolled == []


async def test_a_bad_csr_is_refused_and_leaves_the_token_unused(joining: Admission) -> None:
    token = await joining.tokens.mint(600, DAVE)
    csr = b"-----BEGIN CERTIFICATE REQUEST-----\nnot one\n-----END CERTIFICATE REQUEST-----\n"
    mac = jointoken.enroll_mac(token.secret, "gpu-01", csr)
    refusal = await refused(
        joining, Enroll(token_id=token.id, node_id="gpu-01", csr=csr.decode(), mac=mac)
    )
    assert (refusal.status, refusal.code) == (400, "bad_csr")
    # The node may try again with a good one.
    answer = await joining.tokens.enroll(enroll_ask(token, "gpu-01"))
    assert answer["node_id"] == "gpu-01"


async def test_a_token_used_by_another_node_meanwhile_is_refused(tmp_path: Path) -> None:
    raced = await admission(RacedStore(tmp_path / "raced.db"))
    try:
        token = await raced.tokens.mint(600, DAVE)
        refusal = await refused(raced, enroll_ask(token, "gpu-01"))
        assert (refusal.status, refusal.code) == (403, "token_used")
        assert "just now" in refusal.message
        assert raced.enrolled == []
        assert [e["action"] for e in await raced.store.audit_log()] == ["token.create"]
    finally:
        await raced.store.close()
