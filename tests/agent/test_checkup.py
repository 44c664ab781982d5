"""``llmgw doctor``'s link checks, each with its fix: the route to the control plane, a
real mutual-TLS handshake with the node's certificate (against TLS servers on loopback
that trust it, that the node does not trust, that refuse the node, and none at all), the
certificate's time left, the engines installed against the fleet's wish, and the
firewall's plan."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw import pki
from llmgw.agent import checkup
from llmgw.agent.checkup import (
    cert_check,
    engines_check,
    firewall_check,
    installed_engines,
    route_check,
    tls_check,
)
from llmgw.agent.firewall import STATE_FILE as FIREWALL_FILE
from llmgw.agent.firewall import FirewallPlan, save_plan
from llmgw.agent.identity import AgentState

CA = pki.make_ca("doctor-test")
SERVER = pki.make_server_cert(CA, ["127.0.0.1", "localhost"])
# A cluster this node was never enrolled with.
OTHER_CA = pki.make_ca("another-cluster")


def enrolled(directory: Path, ca: pki.KeyPair = CA, node_id: str = "gpu-01") -> AgentState:
    """A state dir as enrollment leaves it: the node's key and certificate, the CA."""
    key_pem, csr = pki.make_csr(node_id)
    cert_pem, _ = pki.sign_csr(ca, csr, node_id)
    state = AgentState(directory, node_id, ["127.0.0.1:8443"])
    state.save()
    state.key_path.write_bytes(key_pem)
    state.cert_path.write_bytes(cert_pem)
    state.ca_path.write_bytes(ca.cert_pem)
    return state


# ------------------------------------------------------------------ route


def test_the_route_names_the_local_address_that_reaches_the_control_plane() -> None:
    check, local = route_check("127.0.0.1:8443")
    assert (check.name, check.status, local) == ("route", "ok", "127.0.0.1")
    assert check.detail == "127.0.0.1:8443 is reached from 127.0.0.1"


def test_no_route_fails_with_the_reason_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def unresolvable(*args: object, **kw: object) -> Any:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    check, local = route_check("cp.example:8443")
    assert (check.status, local) == ("fail", None)
    assert "no route to the control plane at cp.example:8443" in check.detail
    assert "Name or service not known" in check.detail
    assert check.fix is not None and "ip route get" in check.fix


# ------------------------------------------------------------------ mutual TLS

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def answers_settings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An agents' port that reads the preface and answers with HTTP/2 SETTINGS."""
    try:
        await reader.readexactly(24)
        writer.write(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        await writer.drain()
        await reader.read(64)
    except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        writer.close()


def server_context(
    client_ca: pki.KeyPair, tmp: Path, served: pki.KeyPair = SERVER
) -> ssl.SSLContext:
    """The agents' port's TLS as the control plane sets it up (``pki.server_tls``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "s.crt").write_bytes(served.cert_pem)
    (tmp / "s.key").write_bytes(served.key_pem)
    (tmp / "ca.crt").write_bytes(client_ca.cert_pem)
    return pki.server_tls(tmp / "s.crt", tmp / "s.key", tmp / "ca.crt")


@pytest.fixture
async def listen() -> AsyncIterator[Callable[[ssl.SSLContext], Awaitable[str]]]:
    """Starts a TLS server on loopback; its address."""
    servers: list[asyncio.Server] = []

    async def start(ctx: ssl.SSLContext) -> str:
        server = await asyncio.start_server(answers_settings, "127.0.0.1", 0, ssl=ctx)
        servers.append(server)
        return f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_a_control_plane_that_trusts_the_node_is_ok_both_ways(
    tmp_path: Path, listen: Callable[[ssl.SSLContext], Awaitable[str]]
) -> None:
    state = enrolled(tmp_path / "state")
    address = await listen(server_context(CA, tmp_path / "server"))
    check = await tls_check(state, address)
    assert (check.name, check.status) == ("tls", "ok")
    assert check.detail == f"mutual TLS with {address}: trusted both ways, HTTP/2 (h2)"


async def test_a_control_plane_of_another_cluster_is_not_trusted(
    tmp_path: Path, listen: Callable[[ssl.SSLContext], Awaitable[str]]
) -> None:
    state = enrolled(tmp_path / "state")
    foreign = pki.make_server_cert(OTHER_CA, ["127.0.0.1"])
    address = await listen(server_context(CA, tmp_path / "server", served=foreign))
    check = await tls_check(state, address)
    assert check.status == "fail"
    assert f"{address} presented a certificate this node does not trust" in check.detail
    assert check.fix is not None and "llmgw node token" in check.fix


async def test_a_control_plane_that_refuses_the_nodes_certificate_says_so(
    tmp_path: Path, listen: Callable[[ssl.SSLContext], Awaitable[str]]
) -> None:
    # The node holds a certificate of a cluster this control plane does not trust for
    # clients, though the node trusts the control plane's own.
    state = enrolled(tmp_path / "state", ca=OTHER_CA)
    state.ca_path.write_bytes(CA.cert_pem)
    address = await listen(server_context(CA, tmp_path / "server"))
    check = await tls_check(state, address)
    assert check.status == "fail"
    assert check.detail.startswith(f"{address} refused this node's certificate")
    assert check.fix is not None and "enroll it again" in check.fix


async def test_nothing_listening_is_a_connection_failure_with_its_fix(tmp_path: Path) -> None:
    state = enrolled(tmp_path / "state")
    with socket.socket() as s:  # a port just free: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    check = await tls_check(state, f"127.0.0.1:{port}", timeout=2.0)
    assert check.status == "fail"
    assert f"cannot connect to the agents' port 127.0.0.1:{port}" in check.detail
    assert check.fix is not None and "llmgw server run" in check.fix


# ------------------------------------------------------------------ certificate


def certificate_for(state: AgentState, days: int) -> None:
    """The node's certificate replaced by one that ends ``days`` from now."""
    ca_key = serialization.load_pem_private_key(CA.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(CA.cert_pem)
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, state.node_id)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=400))
        .not_valid_after(now + dt.timedelta(days=days, hours=12))
        .sign(ca_key, hashes.SHA256())
    )
    state.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.mark.parametrize(
    ("days", "status"), [(365, "ok"), (30, "ok"), (29, "warn"), (0, "warn"), (-2, "fail")]
)
def test_the_certificates_time_left(tmp_path: Path, days: int, status: str) -> None:
    state = enrolled(tmp_path)
    certificate_for(state, days)
    check = cert_check(state)
    assert (check.name, check.status) == ("certificate", status)
    end = x509.load_pem_x509_certificate(state.cert_path.read_bytes()).not_valid_after_utc
    if status == "ok":
        assert check.detail == f"node gpu-01, valid until {end:%Y-%m-%d}"
        assert check.fix is None
    else:
        assert check.detail == f"node certificate expires {end:%Y-%m-%d}"
        assert check.fix == "enroll the node again with a new token"


def test_a_fresh_enrollments_certificate_is_ok(tmp_path: Path) -> None:
    assert cert_check(enrolled(tmp_path)).status == "ok"


# ------------------------------------------------------------------ engines


def install(state_dir: Path, engine: str, version: str, build: str) -> None:
    directory = state_dir / "engines" / engine / f"{version}-{build}"
    directory.mkdir(parents=True)
    marker = {"engine": engine, "version": version, "build": build}
    (directory / "installed.json").write_text(json.dumps(marker))


def wish(state_dir: Path, engines: dict[str, str], build: str | None = "auto") -> None:
    doc: dict[str, Any] = {"version": 3, "engines": {e: {"version": v} for e, v in engines.items()}}
    if build is not None:
        doc["build"] = build
    (state_dir / "engines-wanted.json").write_text(json.dumps(doc))


def test_installed_engines_are_read_from_their_markers(tmp_path: Path) -> None:
    install(tmp_path, "llama.cpp", "b4321", "cpu")
    install(tmp_path, "llama.cpp", "b4400", "cuda")
    install(tmp_path, "vllm", "0.9.1", "cu128")
    unmarked = tmp_path / "engines" / "llama.cpp" / "b5000-cpu"
    unmarked.mkdir()  # unpacked, never marked installed
    broken = tmp_path / "engines" / "sglang" / "0.4-cu128"
    broken.mkdir(parents=True)
    (broken / "installed.json").write_text("{not json")
    assert installed_engines(tmp_path) == {
        "llama.cpp": ["b4321 (cpu)", "b4400 (cuda)"],
        "vllm": ["0.9.1 (cu128)"],
    }
    assert installed_engines(tmp_path / "nothing-here") == {}


def test_engines_without_a_wish_from_the_fleet(tmp_path: Path) -> None:
    check = engines_check(tmp_path)
    assert (check.status, check.detail) == (
        "ok",
        "none installed; the fleet has named none to this node yet",
    )
    install(tmp_path, "llama.cpp", "b4321", "cpu")
    assert engines_check(tmp_path).detail.startswith("llama.cpp b4321 (cpu); the fleet has")


def test_engines_as_the_fleet_wants_them(tmp_path: Path) -> None:
    install(tmp_path, "llama.cpp", "b4321", "cpu")
    install(tmp_path, "vllm", "0.9.1", "cu128")
    wish(tmp_path, {"llama.cpp": "b4321", "vllm": "0.9.1"}, build="cpu")
    check = engines_check(tmp_path)
    assert check.status == "ok" and check.fix is None
    assert check.detail == (
        "llama.cpp b4321 (cpu); vllm 0.9.1 (cu128); the fleet wants llama.cpp b4321, "
        "vllm 0.9.1 (build cpu)"
    )


def test_engines_behind_the_fleets_wish_warn_naming_them(tmp_path: Path) -> None:
    install(tmp_path, "llama.cpp", "b4321", "cpu")
    # A version whose name begins as the wanted one's does is not the wanted one.
    install(tmp_path, "vllm", "0.9.10", "cu128")
    wish(tmp_path, {"llama.cpp": "b4400", "vllm": "0.9.1", "sglang": "0.4.6"}, build=None)
    check = engines_check(tmp_path)
    assert check.status == "warn"
    assert check.detail.endswith(
        "(build auto); not here yet: llama.cpp b4400, sglang 0.4.6, vllm 0.9.1"
    )
    assert check.fix is not None and "llmgw ctl engines" in check.fix


def test_a_wish_of_no_engines_is_met(tmp_path: Path) -> None:
    wish(tmp_path, {})
    check = engines_check(tmp_path)
    assert check.status == "ok" and "the fleet wants none (build auto)" in check.detail


# ------------------------------------------------------------------ firewall


def test_no_firewall_plan_is_no_check(tmp_path: Path) -> None:
    assert firewall_check(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "says"), [("{broken", "cannot be read"), ("[1, 2]", "expected a JSON object")]
)
def test_an_unreadable_firewall_plan_fails_with_its_fix(
    tmp_path: Path, text: str, says: str
) -> None:
    (tmp_path / FIREWALL_FILE).write_text(text)
    check = firewall_check(tmp_path)
    assert check is not None and check.status == "fail" and says in check.detail
    assert check.fix == "`llmgw firewall sync` after the agent reconnects"


@pytest.mark.parametrize(("enabled", "status"), [(True, "warn"), (False, "ok")])
def test_a_node_that_cannot_keep_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool, status: str
) -> None:
    monkeypatch.setattr(checkup, "available", lambda: False)
    save_plan(tmp_path, FirewallPlan(enabled=enabled))
    check = firewall_check(tmp_path)
    assert check is not None and check.status == status
    if enabled:
        assert "only an agent running as root with nft" in check.detail
    else:
        assert check.detail == "the cluster keeps no table here"


class FakeNft:
    """nft as the check asks it: the table's status against the plan."""

    answer: dict[str, Any] = {}

    def status(self, plan: FirewallPlan) -> dict[str, Any]:
        return self.answer


@pytest.mark.parametrize(
    ("answer", "enabled", "status", "detail"),
    [
        ({"in_sync": True}, True, "ok", "llmgw's table is loaded as the cluster asks"),
        ({"in_sync": True}, False, "ok", "off"),
        (
            {"in_sync": False, "problem": "the table is missing"},
            True,
            "fail",
            "the table is missing",
        ),
        ({"in_sync": False}, True, "fail", "llmgw's table is not as the cluster asks"),
    ],
)
def test_the_table_against_the_plan(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answer: dict[str, Any],
    enabled: bool,
    status: str,
    detail: str,
) -> None:
    monkeypatch.setattr(checkup, "available", lambda: True)
    monkeypatch.setattr(FakeNft, "answer", answer)
    monkeypatch.setattr(checkup, "Nft", FakeNft)
    save_plan(tmp_path, FirewallPlan(enabled=enabled))
    check = firewall_check(tmp_path)
    assert check is not None and (check.status, check.detail) == (status, detail)
    if status == "fail":
        assert check.fix is not None and "llmgw firewall sync" in check.fix
