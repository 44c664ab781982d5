"""An agent's identity: its state dir, and enrolling once with a join token.

State dir layout::

    node.key     the node's private key, made here, never sent anywhere (0600)
    node.crt     its certificate, signed by the cluster CA; CN = node id
    ca.crt       the cluster CA, pinned by the join token's fingerprint
    state.yaml   node id and every control plane's agent address, newest list first
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from llmgw import jointoken, pki
from llmgw.config import format_hostport, parse_hostport
from llmgw.jsonvalue import JSONObject


class EnrollError(RuntimeError):
    """Enrollment failed; the message says why and what to do."""


@dataclass
class AgentState:
    dir: Path
    node_id: str = ""
    control_planes: list[str] = field(default_factory=list)

    @property
    def key_path(self) -> Path:
        return self.dir / "node.key"

    @property
    def cert_path(self) -> Path:
        return self.dir / "node.crt"

    @property
    def ca_path(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def state_path(self) -> Path:
        return self.dir / "state.yaml"

    def enrolled(self) -> bool:
        return all(
            p.exists() for p in (self.key_path, self.cert_path, self.ca_path, self.state_path)
        )

    @classmethod
    def load(cls, directory: Path) -> AgentState:
        state = cls(directory)
        if state.state_path.exists():
            data = yaml.safe_load(state.state_path.read_text()) or {}
            state.node_id = str(data.get("node_id", ""))
            state.control_planes = [str(a) for a in data.get("control_planes", [])]
        return state

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(
            yaml.safe_dump({"node_id": self.node_id, "control_planes": self.control_planes})
        )
        tmp.replace(self.state_path)

    def learn_control_planes(self, addresses: list[str]) -> bool:
        """Keep the leader's list of control planes; True when it changed."""
        if addresses and addresses != self.control_planes:
            self.control_planes = list(addresses)
            self.save()
            return True
        return False


def default_node_id() -> str:
    return socket.gethostname().split(".")[0]


async def enroll(
    state_dir: Path,
    token_text: str,
    node_id: str,
    server: str | None = None,
    timeout: float = 10.0,
) -> AgentState:
    """Join the cluster: make a key, have the control plane sign it, pin its CA."""
    token = jointoken.parse(token_text)
    if token.expired():
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(token.expires_at))
        raise EnrollError(
            f"the join token expired at {when}; "
            "make a new one with `llmgw node token` on the control plane"
        )
    key_pem, csr_pem = pki.make_csr(node_id)
    body = {
        "token_id": token.id,
        "node_id": node_id,
        "csr": csr_pem.decode(),
        "mac": jointoken.enroll_mac(token.secret, node_id, csr_pem),
    }
    addresses = ([server] if server else []) + [a for a in token.addresses if a != server]
    failures: list[str] = []
    for address in addresses:
        host, port = parse_hostport(address)
        url = f"http://{format_hostport(host, port)}/api/v1/enroll"
        try:
            status, answer = await asyncio.to_thread(jointoken.post, url, body, timeout)
        except (OSError, ValueError) as exc:
            failures.append(f"{address}: {exc}")
            continue
        if status != 200:
            message = jointoken.refusal(status, answer)
            raise EnrollError(f"the control plane at {address} refused to enroll: {message}")
        return _accept(state_dir, token, node_id, key_pem, answer, address)
    raise EnrollError(
        "could not reach a control plane to enroll: "
        + "; ".join(failures)
        + ". Check the address (--server HOST:PORT is the control plane's --listen) and "
        "that nothing blocks the port"
    )


def _accept(
    state_dir: Path,
    token: jointoken.JoinToken,
    node_id: str,
    key_pem: bytes,
    answer: JSONObject,
    address: str,
) -> AgentState:
    cert_pem = str(answer.get("cert", "")).encode()
    ca_pem = str(answer.get("ca", "")).encode()
    if not jointoken.check(
        jointoken.answer_mac(token.secret, cert_pem, ca_pem), str(answer.get("mac", ""))
    ):
        raise EnrollError(
            f"the server at {address} does not hold this join token: it is not the control "
            "plane that made it (or something in between changed its answer)"
        )
    try:
        fp = pki.fingerprint(ca_pem)
    except ValueError as exc:
        raise EnrollError(f"the server at {address} sent a damaged CA certificate") from exc
    if fp != token.ca_fingerprint:
        raise EnrollError(
            f"the server at {address} presented CA {fp[:16]}..., not the one the token pins "
            f"({token.ca_fingerprint[:16]}...); refusing to trust it"
        )
    if not pki.verify_issued_by(cert_pem, ca_pem) or not pki.cert_matches_key(cert_pem, key_pem):
        raise EnrollError(f"the certificate from {address} is not for this node's key")
    state = AgentState(state_dir, node_id=node_id)
    state.dir.mkdir(parents=True, exist_ok=True)
    # Traversable but not listable: engines running as the engines' user reach their
    # install under it, while the key and shard specs stay 0600 files.
    state.dir.chmod(0o711)
    pki.write_private(state.key_path, key_pem)
    state.cert_path.write_bytes(cert_pem)
    state.ca_path.write_bytes(ca_pem)
    planes = answer.get("control_planes", [])
    state.control_planes = [str(a) for a in planes] if isinstance(planes, list) else []
    if not state.control_planes:
        raise EnrollError(f"the control plane at {address} named no agent address")
    state.save()
    return state
