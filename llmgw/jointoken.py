"""Join tokens: how a new node finds its control plane and proves it was invited.

A token carries the control planes' addresses, the cluster CA's fingerprint, an id and a
secret. The secret never crosses the wire: the agent MACs its CSR with it, and the control
plane MACs its answer, so each side knows the other holds the same token, and the agent
pins the CA before trusting anything the control plane says.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from llmgw.jsonvalue import JSON, JSONObject

PREFIX = "llmgw-join-1."
# A token for a new control plane (`server token`): the same shape, its own prefix, and an
# id the control plane recognises, so neither kind of token joins as the other.
SERVER_PREFIX = "llmgw-server-1."
SERVER_ID = "s-"


class TokenError(ValueError):
    """A join token that cannot be used, and why (expired, reused, forged, malformed)."""


@dataclass(frozen=True)
class JoinToken:
    id: str
    secret: bytes
    addresses: list[str]
    ca_fingerprint: str
    expires_at: float

    @property
    def for_server(self) -> bool:
        return self.id.startswith(SERVER_ID)

    def encode(self) -> str:
        body = msgpack.packb(
            {
                "i": self.id,
                "s": self.secret,
                "a": self.addresses,
                "f": self.ca_fingerprint,
                "e": int(self.expires_at),
            },
            use_bin_type=True,
        )
        prefix = SERVER_PREFIX if self.for_server else PREFIX
        return prefix + base64.urlsafe_b64encode(body).decode().rstrip("=")

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at


def parse(text: str, server: bool = False) -> JoinToken:
    """A node's join token, or with ``server`` a new control plane's."""
    text = text.strip()
    prefix, other = (SERVER_PREFIX, PREFIX) if server else (PREFIX, SERVER_PREFIX)
    make = "llmgw server token" if server else "llmgw node token"
    if text.startswith(other):
        kind = (
            "a control plane's (for `llmgw server join`)"
            if other == SERVER_PREFIX
            else ("a node's (for `llmgw agent run` or `llmgw node add`)")
        )
        raise TokenError(f"this token is {kind}; make one with `{make}` on the control plane")
    if not text.startswith(prefix):
        raise TokenError(
            f"not an llmgw {'server' if server else 'join'} token (it should start with "
            f"'{prefix}'); make one with `{make}` on the control plane"
        )
    raw = text[len(prefix) :]
    try:
        data = msgpack.unpackb(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        return JoinToken(
            id=str(data["i"]),
            secret=bytes(data["s"]),
            addresses=[str(a) for a in data["a"]],
            ca_fingerprint=str(data["f"]),
            expires_at=float(data["e"]),
        )
    except Exception as exc:
        raise TokenError(
            f"the token is damaged (copied incompletely?); make a new one with `{make}`"
        ) from exc


def _mac(secret: bytes, label: bytes, *parts: bytes) -> str:
    h = hmac.new(secret, label, hashlib.sha256)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.hexdigest()


def enroll_mac(secret: bytes, node_id: str, csr_pem: bytes) -> str:
    """The agent's proof that it holds the token, bound to the CSR it sends."""
    return _mac(secret, b"llmgw enroll", node_id.encode(), csr_pem)


def answer_mac(secret: bytes, cert_pem: bytes, ca_pem: bytes) -> str:
    """The control plane's proof that it holds the token, bound to what it answers."""
    return _mac(secret, b"llmgw enrolled", cert_pem, ca_pem)


def join_mac(secret: bytes, name: str, csr_pem: bytes) -> str:
    """A joining control plane's proof that it holds its token, bound to its CSR."""
    return _mac(secret, b"llmgw server join", name.encode(), csr_pem)


def joined_mac(secret: bytes, cert_pem: bytes, ca_pem: bytes, sealed: bytes) -> str:
    """The leader's proof that it holds the token, bound to all it answers."""
    return _mac(secret, b"llmgw server joined", cert_pem, ca_pem, sealed)


def check(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def post(url: str, body: Mapping[str, object], timeout: float) -> tuple[int, JSONObject]:
    """A joiner's POST to the control plane's HTTP listener (it holds no certificate
    yet; the MACs prove both sides): the status and the JSON answer ({} when none, or
    when it is not a JSON object)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, _object(json.loads(resp.read() or b"{}"))
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, _object(json.loads(exc.read() or b"{}"))
        except ValueError:
            return exc.code, {}


def _object(answer: JSON) -> JSONObject:
    return answer if isinstance(answer, dict) else {}


def refusal(status: int, answer: JSONObject) -> str:
    """Why the control plane said no: its error's message, else the HTTP status."""
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else f"HTTP {status}"
