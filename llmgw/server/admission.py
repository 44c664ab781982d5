"""Join tokens: minted for a node (`node token`) or a new control plane (`server
token`), checked when one comes to join, each refusal with the reason and the fix; and
a node's enrollment, which signs its certificate once its token checks.

``JoinTokens`` is the service: a token's secret is sealed in the store and its making
audited under the caller's name; an enrollment is audited under the token's."""

from __future__ import annotations

import datetime as dt
import re
import secrets
import time
from collections.abc import Awaitable, Callable

from llmgw import jointoken, pki
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import Enroll
from llmgw.server.store import JoinTokenRecord, Store

# A node's id, or a control plane's name.
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def new_token_record(
    secret: bytes, ttl: int, token_secret: bytes, actor: str, server: bool = False
) -> JoinTokenRecord:
    now = time.time()
    return JoinTokenRecord(
        id=(jointoken.SERVER_ID if server else "") + secrets.token_hex(8),
        secret_sealed=pki.seal(secret, token_secret),
        created_at=now,
        expires_at=now + ttl,
        created_by=actor,
    )


async def check_token(
    store: Store,
    cluster_secret: bytes,
    token_id: str,
    mac_of: Callable[[bytes, str, bytes], str],
    who: str,
    signed: bytes,
    mac: str,
    server: bool = False,
) -> bytes:
    """The token's secret, once the token is known, of the right kind, proven by ``mac``
    (``mac_of(secret, who, signed)``), unused and unexpired; else a 403 saying which."""
    make = "llmgw server token" if server else "llmgw node token"
    noun, joiner = ("server token", "control plane") if server else ("join token", "node")
    record = await store.get_join_token(token_id)
    if record is None:
        raise Refusal(
            403,
            "token_forged",
            f"this {noun} was not issued by this control plane (forged, or from another "
            f"cluster); make one with `{make}` on the control plane",
        )
    if token_id.startswith(jointoken.SERVER_ID) != server:
        kind = "a control plane's" if not server else "a node's"
        raise Refusal(
            403,
            "token_kind",
            f"this token is {kind}, not for this; make one with `{make}` on the control plane",
        )
    secret = pki.unseal(cluster_secret, record.secret_sealed)
    if not jointoken.check(mac_of(secret, who, signed), mac):
        raise Refusal(
            403,
            "token_forged",
            f"the {noun}'s secret does not match the one issued (forged or altered); "
            f"make a new one with `{make}`",
        )
    if record.used_at is not None:
        raise Refusal(
            403,
            "token_used",
            f"this {noun} was already used by {joiner} "
            f"{(record.used_by or '').removeprefix('server:')!r} at {_iso(record.used_at)}; "
            f"each token joins one {joiner}, make a new one with `{make}`",
        )
    if time.time() >= record.expires_at:
        raise Refusal(
            403,
            "token_expired",
            f"this {noun} expired at {_iso(record.expires_at)}; make a new one with `{make}`",
        )
    return secret


class JoinTokens:
    def __init__(
        self,
        store: Store,
        cluster_secret: bytes,
        ca: pki.KeyPair,
        api_addresses: list[str],
        agent_addresses: list[str],
        enrolled: Callable[[str, int], Awaitable[None]],
    ) -> None:
        """``api_addresses`` go into each token (where to join); ``agent_addresses``
        into each enrolled node's answer (where its stream goes); ``enrolled`` tells
        the fleet a node's newest certificate."""
        self.store = store
        self.cluster_secret = cluster_secret
        self.ca = ca
        self.ca_fingerprint = pki.fingerprint(ca.cert_pem)
        self.api_addresses = api_addresses
        self.agent_addresses = agent_addresses
        self.enrolled = enrolled

    async def mint(self, ttl: int, by: Principal, server: bool = False) -> jointoken.JoinToken:
        """A token for a node or (``server``) a new control plane: its secret sealed in
        the store, its making audited."""
        secret = pki.new_secret()
        record = new_token_record(self.cluster_secret, ttl, secret, by.name, server=server)
        await self.store.add_join_token(record)
        action = "server.token" if server else "token.create"
        await self.store.audit(by.name, action, record.id, f"ttl {ttl}s")
        return jointoken.JoinToken(
            id=record.id,
            secret=secret,
            addresses=self.api_addresses,
            ca_fingerprint=self.ca_fingerprint,
            expires_at=record.expires_at,
        )

    async def enroll(self, ask: Enroll) -> dict[str, object]:
        """Check the token, sign the node's CSR, and answer with proof we hold the
        token."""
        node_id = ask.node_id
        if not NODE_ID.fullmatch(node_id):
            raise Refusal(
                400,
                "bad_node_id",
                f"node id {node_id!r} is not valid: use letters, digits, '.', '_' or '-', "
                "up to 63 characters, starting with a letter or digit",
            )
        csr = ask.csr.encode()
        secret = await check_token(
            self.store,
            self.cluster_secret,
            ask.token_id,
            jointoken.enroll_mac,
            node_id,
            csr,
            ask.mac,
        )
        now = time.time()
        try:
            cert_pem, serial = pki.sign_csr(self.ca, csr, node_id)
        except pki.PKIError as exc:
            raise Refusal(400, "bad_csr", str(exc)) from None
        if not await self.store.use_join_token(ask.token_id, node_id, now):
            raise Refusal(403, "token_used", "this join token was used by another node just now")
        await self.enrolled(node_id, serial)
        await self.store.audit(
            f"join token {ask.token_id}", "node.enroll", node_id, f"serial {serial}"
        )
        ca_pem = self.ca.cert_pem
        return {
            "node_id": node_id,
            "cert": cert_pem.decode(),
            "ca": ca_pem.decode(),
            "control_planes": self.agent_addresses,
            "mac": jointoken.answer_mac(secret, cert_pem, ca_pem),
        }
