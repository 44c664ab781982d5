"""Join tokens as the control plane checks them: for a node (`node token`) or a new
control plane (`server token`), each refused with the reason and the fix."""

from __future__ import annotations

import datetime as dt
import re
import secrets
import time
from collections.abc import Callable

from llmgw import jointoken, pki
from llmgw.server.refusal import Refusal
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
