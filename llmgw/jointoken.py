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
import time
from dataclasses import dataclass

import msgpack

PREFIX = "llmgw-join-1."


class TokenError(ValueError):
    """A join token that cannot be used, and why (expired, reused, forged, malformed)."""


@dataclass(frozen=True)
class JoinToken:
    id: str
    secret: bytes
    addresses: list[str]
    ca_fingerprint: str
    expires_at: float

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
        return PREFIX + base64.urlsafe_b64encode(body).decode().rstrip("=")

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at


def parse(text: str) -> JoinToken:
    text = text.strip()
    if not text.startswith(PREFIX):
        raise TokenError(
            "not an llmgw join token (it should start with 'llmgw-join-1.'); "
            "make one with `llmgw node token` on the control plane"
        )
    raw = text[len(PREFIX) :]
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
            "the join token is damaged (copied incompletely?); make a new "
            "one with `llmgw node token`"
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


def check(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())
