"""The agents' port refuses strangers at the handshake and bad frames per connection."""

from __future__ import annotations

import asyncio
import ssl
import struct
from pathlib import Path

import pytest
from h2.events import DataReceived, StreamEnded

from llmgw import pki
from llmgw.agent.identity import enroll
from llmgw.h2link import CONTENT_TYPE, STREAM_PATH, H2Link
from llmgw.wire import FrameDecoder, HostFacts, Register, encode_frame
from llmgw.wire.messages import Goodbye, decode_message, encode_message
from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e


def _client_ctx(root: Path, pair: pki.KeyPair | None, ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca = root / "trust.crt"
    ca.write_bytes(ca_pem)
    ctx.load_verify_locations(ca)
    ctx.set_alpn_protocols(["h2"])
    if pair is not None:
        (root / "c.key").write_bytes(pair.key_pem)
        (root / "c.crt").write_bytes(pair.cert_pem)
        ctx.load_cert_chain(root / "c.crt", root / "c.key")
    return ctx


async def _handshake_and_read(cluster: Cluster, ctx: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", cluster.agent_port, ssl=ctx, server_hostname="127.0.0.1"
    )
    try:
        # TLS 1.3 finishes the client's side first; the server's verdict comes on read.
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        return await asyncio.wait_for(reader.read(100), 5)
    finally:
        writer.close()


def _foreign_client(tmp_path: Path) -> pki.KeyPair:
    """A well-formed client certificate, but from a CA that is not the cluster's."""
    other_ca = pki.make_ca("elsewhere")
    key_pem, csr_pem = pki.make_csr("intruder")
    cert_pem, _ = pki.sign_csr(other_ca, csr_pem, "intruder")
    return pki.KeyPair(key_pem, cert_pem)


async def test_foreign_or_missing_client_certificate_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    ca_pem = (cluster.data_dir / "pki" / "ca.crt").read_bytes()
    for pair in (_foreign_client(tmp_path), None):
        with pytest.raises((ssl.SSLError, ConnectionError)) as info:
            data = await _handshake_and_read(cluster, _client_ctx(tmp_path, pair, ca_pem))
            # A server that let us in would answer with its SETTINGS frame.
            assert data == b"", "the server accepted a client it should refuse"
            raise ConnectionError("closed without a TLS alert")
        assert info.value is not None
    assert cluster.nodes() == {}
    assert "intruder" not in (cluster.root / "server.log").read_text()


async def test_http1_client_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    state = await enroll(tmp_path / "n", cluster.token(), "h1node", cluster.listen)
    ctx = pki.client_tls(state.cert_path, state.key_path, state.ca_path)
    ctx.set_alpn_protocols(["http/1.1"])
    with pytest.raises((ssl.SSLError, ConnectionError)):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", cluster.agent_port, ssl=ctx, server_hostname="127.0.0.1"
        )
        writer.write(b"POST /agent/v1/stream HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await asyncio.wait_for(reader.read(100), 5)
        writer.close()
        assert data == b""
        raise ConnectionError("closed")


async def _open_stream(
    cluster: Cluster, root: Path, node_id: str, register_as: str | None = None
) -> tuple[H2Link, int]:
    """Enroll ``node_id``, open its stream and send a Register (as ``register_as``)."""
    state = await enroll(root / node_id, cluster.token(), node_id, cluster.listen)
    ctx = pki.client_tls(state.cert_path, state.key_path, state.ca_path)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", cluster.agent_port, ssl=ctx, server_hostname="127.0.0.1"
    )
    link = H2Link(reader, writer, client_side=True)
    link.start()
    sid = link.conn.get_next_available_stream_id()
    link.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "x"),
            (":path", STREAM_PATH),
            ("content-type", CONTENT_TYPE),
        ],
    )
    name = register_as or node_id
    host = HostFacts(hostname=name, os="test", arch="x86_64")
    await link.send(sid, encode_message(Register(node_id=name, version="t", host=host)))
    return link, sid


async def _goodbye(link: H2Link, sid: int) -> str:
    """Read until the server ends the stream; the reason it gave."""
    decoder = FrameDecoder()
    reason = ""
    while True:
        data = await asyncio.wait_for(link.reader.read(65536), 5)
        if not data:
            return reason
        for event in link.receive(data):
            if isinstance(event, DataReceived) and event.stream_id == sid:
                for payload in decoder.feed(event.data):
                    msg = decode_message(payload)
                    if isinstance(msg, Goodbye):
                        reason = msg.reason
            if isinstance(event, StreamEnded) and event.stream_id == sid:
                return reason


@pytest.mark.parametrize(
    ("garbage", "expected"),
    [
        (struct.pack(">I", 64 * 1024 * 1024), "exceeds"),
        (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "not valid msgpack"),
        (struct.pack(">I", 2) + b"\x91\x01", "not a map"),
        (encode_frame({"t": "heartbeat", "seq": "one"}), "expected int"),
    ],
    ids=["oversized", "not-msgpack", "not-a-map", "wrong-type"],
)
async def test_bad_frames_end_only_that_stream(
    cluster: Cluster, tmp_path: Path, garbage: bytes, expected: str
) -> None:
    cluster.start_agent("steady", cluster.token())
    cluster.wait_state("steady", "Ready", 20)
    link, sid = await _open_stream(cluster, tmp_path, "bad")
    wait_for(lambda: cluster.nodes().get("bad", {}).get("state") == "Ready", 10, "bad Ready")
    await link.send(sid, garbage)
    reason = await _goodbye(link, sid)
    link.close()
    assert reason.startswith("bad frame") and expected in reason
    assert "sent a bad frame" in (cluster.root / "server.log").read_text()
    # The other agent never noticed.
    before = cluster.api("/api/v1/status")["heartbeats"]
    wait_for(lambda: cluster.api("/api/v1/status")["heartbeats"] > before, 5, "more heartbeats")
    steady = cluster.nodes()["steady"]
    assert steady["state"] == "Ready" and steady["connected"]


async def test_register_for_another_node_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    link, sid = await _open_stream(cluster, tmp_path, "mallory", register_as="victim")
    reason = await _goodbye(link, sid)
    link.close()
    assert "certificate is for 'mallory'" in reason
    assert "victim" not in cluster.nodes()
