"""A new control plane joins the cluster: ``server token`` on the leader, ``server join``
on the new machine.

The new control plane makes its own key (it never leaves the machine) and sends a CSR
with a MAC under the token's secret, like a node's enrollment. The leader checks the
token (issued for a control plane, unused, unexpired), signs the CSR as a certificate for
the agents' port and the control planes' link, records the control plane, and answers
with the certificate, the CA, and the cluster's secret and CA key sealed under the
token's secret for that request: only the token's holder can open them, and every
control plane then derives the same engine keys, opens the same sealed secrets, and can
sign nodes' certificates once it leads. The joiner pins the CA the token names and
checks the leader's MAC before it trusts any of it, then takes a snapshot of the store
over the control planes' link with its new certificate and writes its data dir.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack

from llmgw import jointoken, pki
from llmgw.config import ServerConfig, build, dump, format_hostport, parse_hostport
from llmgw.server.admission import NODE_ID, check_token
from llmgw.server.datadir import DataDir, InitError, default_advertise
from llmgw.server.ha.peerlink import LeaderInfo, PeerClient, PeerError
from llmgw.server.refusal import Refusal
from llmgw.server.requests import JoinServer
from llmgw.server.store import Audit, ServerRecord, Store


@dataclass(frozen=True)
class Admission:
    """What the leader needs to let a control plane in."""

    store: Store
    secret: bytes
    ca: pki.KeyPair
    leader: LeaderInfo | None
    term: int
    # The store's backend and DSN: a PostgreSQL store is shared, so the joiner uses the
    # same (its DSN may hold a password: it travels sealed).
    store_config: dict[str, str]


def _context(name: str, csr: bytes) -> bytes:
    return b"llmgw server join\x00" + name.encode() + b"\x00" + csr


async def admit(ctx: Admission, ask: JoinServer) -> dict[str, object]:
    """The leader's side of ``server join``."""
    if not NODE_ID.fullmatch(ask.name):
        raise Refusal(
            400,
            "bad_name",
            f"control plane name {ask.name!r} is not valid: use letters, digits, '.', '_' "
            "or '-', up to 63 characters, starting with a letter or digit",
        )
    secret = await check_token(
        ctx.store,
        ctx.secret,
        ask.token_id,
        jointoken.join_mac,
        ask.name,
        ask.csr.encode(),
        ask.mac,
        server=True,
    )
    current = {s.name: s for s in await ctx.store.list_servers()}.get(ask.name)
    if current is not None and current.removed_at is None:
        raise Refusal(
            409,
            "server_exists",
            f"a control plane named {ask.name!r} is already part of the cluster; pick "
            f"another --name, or remove it first with `llmgw server remove {ask.name}`",
        )
    for address in (ask.api_address, ask.agent_address, ask.peer_address):
        try:
            parse_hostport(address)
        except ValueError as exc:
            raise Refusal(400, "bad_address", f"{address!r}: {exc}") from None
    try:
        cert_pem, serial = pki.sign_peer_csr(ctx.ca, ask.csr.encode(), ask.name, list(ask.sans))
    except pki.PKIError as exc:
        raise Refusal(400, "bad_csr", str(exc)) from None
    now = time.time()
    if not await ctx.store.use_join_token(ask.token_id, f"server:{ask.name}", now):
        raise Refusal(403, "token_used", "this server token was used by another just now")
    record = ServerRecord(
        ask.name, str(serial), ask.api_address, ask.agent_address, ask.peer_address, now
    )
    await ctx.store.put_server(
        record, Audit(f"server token {ask.token_id}", "server.join", ask.name, f"serial {serial}")
    )
    bundle = msgpack.packb(
        {"cluster_key": ctx.secret, "ca_key": ctx.ca.key_pem, "store": ctx.store_config}
    )
    sealed = pki.seal_for_token(secret, _context(ask.name, ask.csr.encode()), bundle)
    return {
        "name": ask.name,
        "cert": cert_pem.decode(),
        "ca": ctx.ca.cert_pem.decode(),
        "sealed": base64.b64encode(sealed).decode(),
        "leader": ctx.leader,
        "term": ctx.term,
        "mac": jointoken.joined_mac(secret, cert_pem, ctx.ca.cert_pem, sealed),
    }


class JoinError(RuntimeError):
    """``server join`` cannot go on, and why."""


def join(
    root: Path,
    server: str,
    token_text: str,
    *,
    name: str | None = None,
    listen: str = "0.0.0.0:8080",
    agent_port: int = 8443,
    peer_port: int = 8444,
    advertise: list[str] | None = None,
    timeout: float = 30.0,
) -> ServerConfig:
    """Make this machine's data dir as a standby of the cluster ``server`` leads."""
    token = jointoken.parse(token_text, server=True)
    if token.expired():
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(token.expires_at))
        raise JoinError(
            f"the server token expired at {when}; make a new one with `llmgw server token`"
        )
    data = DataDir(root)
    present = data.existing()
    if present:
        raise InitError(
            f"{root} is already a control plane's data dir ({', '.join(present)} exist); "
            "nothing was changed. Use another --data-dir, or remove this one to start over."
        )
    name = name or socket.gethostname()
    listen_host, http_port = parse_hostport(listen)
    advertise = advertise or default_advertise(listen_host)
    first = advertise[0]
    sans = [*advertise, socket.gethostname(), "localhost", "127.0.0.1", "::1"]
    if listen_host not in ("0.0.0.0", "::"):
        sans.append(listen_host)
    key_pem, csr_pem = pki.make_csr(pki.PEER_PREFIX + name)
    body = {
        "token_id": token.id,
        "name": name,
        "csr": csr_pem.decode(),
        "api_address": format_hostport(first, http_port),
        "agent_address": format_hostport(first, agent_port),
        "peer_address": format_hostport(first, peer_port),
        "sans": sans,
        "mac": jointoken.join_mac(token.secret, name, csr_pem),
    }
    host, port = parse_hostport(server)
    url = f"http://{format_hostport(host, port)}/api/v1/servers/join"
    try:
        status, answer = jointoken.post(url, body, timeout)
    except (OSError, ValueError) as exc:
        raise JoinError(
            f"could not reach the leader at {server}: {exc}; --server is the leader's "
            "--listen address (HOST:PORT)"
        ) from exc
    if status != 200:
        message = jointoken.refusal(status, answer)
        raise JoinError(f"the leader at {server} refused: {message}")
    cert_pem = str(answer.get("cert", "")).encode()
    ca_pem = str(answer.get("ca", "")).encode()
    try:
        sealed = base64.b64decode(str(answer.get("sealed", "")))
    except ValueError:
        sealed = b""
    if not jointoken.check(
        jointoken.joined_mac(token.secret, cert_pem, ca_pem, sealed), str(answer.get("mac", ""))
    ):
        raise JoinError(
            f"the server at {server} does not hold this token: it is not the control plane "
            "that made it (or something in between changed its answer)"
        )
    if pki.fingerprint(ca_pem) != token.ca_fingerprint:
        raise JoinError(f"the server at {server} presented a CA other than the token pins")
    if not pki.verify_issued_by(cert_pem, ca_pem) or not pki.cert_matches_key(cert_pem, key_pem):
        raise JoinError(f"the certificate from {server} is not for this control plane's key")
    try:
        bundle = msgpack.unpackb(pki.open_for_token(token.secret, _context(name, csr_pem), sealed))
        cluster_key, ca_key = bytes(bundle["cluster_key"]), bytes(bundle["ca_key"])
        store = {str(k): str(v) for k, v in dict(bundle.get("store") or {}).items()}
    except (pki.PKIError, KeyError, TypeError, ValueError) as exc:
        raise JoinError(f"the cluster's secrets from {server} do not open: {exc}") from exc
    found = answer.get("leader")
    leader = found if isinstance(found, dict) else {}
    config = build(
        ServerConfig,
        {
            "listen": listen,
            "agent_port": agent_port,
            "advertise": advertise,
            # SQLite: this control plane's own copy. PostgreSQL: the same store.
            "store": store if store.get("backend") == "postgres" else {},
            "ha": {
                "name": name,
                "role": "standby",
                "peer_port": peer_port,
                "leader": leader.get("peer_address"),
            },
        },
        "server join",
    )
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    pki.write_private(data.ca_key, ca_key)
    data.ca_cert.write_bytes(ca_pem)
    for cert, key in ((data.server_cert, data.server_key), (data.peer_cert, data.peer_key)):
        pki.write_private(key, key_pem)
        cert.write_bytes(cert_pem)
    pki.write_private(data.cluster_key, cluster_key)
    try:
        if config.store.backend == "sqlite":
            asyncio.run(_first_copy(data, str(leader.get("peer_address"))))
    except PeerError as exc:
        raise JoinError(
            f"joined, but the store could not be copied from the leader: {exc}; "
            f"`llmgw server run --data-dir {root}` copies it when it starts"
        ) from exc
    finally:
        data.config_path.write_text(
            "# llmgw control plane settings; see docs/configuration.md\n" + dump(config)
        )
    return config


async def _first_copy(data: DataDir, leader: str) -> None:
    client = PeerClient(pki.peer_tls(data.peer_cert, data.peer_key, data.ca_cert, server=False))
    try:
        await client.snapshot(leader, data.root / "store.db")
    finally:
        await client.close()
