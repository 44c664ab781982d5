"""Bounded work per connection and request, against a real control plane: a client
that sends nothing or drips its headers, a stalled body, idle keep-alive, 1,100 idle
sockets under a file limit of 1,024, 100,000 messages, oversized and unauthenticated
posts to the admin API (memory stays flat), and every admin field checked."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.catalog import ctl_json, scheduled, serve_tiny
from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.e2e

# Short limits, so each is seen in a second or two.
LIMITS = """
gateway:
  header_timeout: 1
  body_timeout: 1
  keepalive_timeout: 2
  max_messages: 1000
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Cluster]:
    """A control plane that may open 1,024 files at most, serving the tiny model."""
    c = scheduled(
        tmp_path_factory.mktemp("limits"), LIMITS, prefix=["prlimit", "--nofile=1024:1024", "--"]
    )
    try:
        serve_tiny(c, binary)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def key(cluster: Cluster) -> str:
    return str(ctl_json(cluster, "keys", "create", "--name", "limits")["key"])


def connect(cluster: Cluster) -> socket.socket:
    host, port = cluster.listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the other end closed within ``seconds``, and what it said first."""
    sock.settimeout(seconds)
    said = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True, said
            said += chunk
    except TimeoutError:
        return False, said
    except ConnectionResetError:
        return True, said


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_client_that_sends_nothing_or_drips_its_headers_is_closed(cluster: Cluster) -> None:
    silent = connect(cluster)
    start = time.monotonic()
    closed, _ = closed_within(silent, 10)
    assert closed and time.monotonic() - start < 5
    silent.close()

    dripping = connect(cluster)
    start = time.monotonic()
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 50
    with pytest.raises(OSError):  # closed while it still drips
        for byte in request:
            dripping.sendall(bytes([byte]))
            time.sleep(0.2)
    assert time.monotonic() - start < 5
    dripping.close()


def test_a_stalled_body_is_answered_408_and_closed(cluster: Cluster, key: str) -> None:
    sock = connect(cluster)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nContent-Length: 500\r\n\r\n".encode()
        + b'{"model": "tiny", '
    )
    closed, said = closed_within(sock, 10)
    assert closed and said.startswith(b"HTTP/1.1 408"), said[:200]
    assert b"body_timeout" in said
    sock.close()


def test_an_idle_keep_alive_connection_is_closed(cluster: Cluster) -> None:
    sock = connect(cluster)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(10)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    start = time.monotonic()
    closed, _ = closed_within(sock, 10)
    assert closed and 1.5 < time.monotonic() - start < 6  # keepalive_timeout: 2
    sock.close()


def test_idle_sockets_past_the_file_limit_never_keep_out_a_chat_or_the_admin_api(
    cluster: Cluster, key: str
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    held: list[socket.socket] = []
    try:
        for _ in range(1100):
            held.append(connect(cluster))
        # The newest idle sockets are open now; chats and the admin API still get in.
        for _ in range(3):
            status, _, answer = cluster.post("/v1/chat/completions", json.dumps(CHAT).encode(), key)
            assert status == 200, answer
            assert cluster.api("/api/v1/status")["serving"] == "serving"
        cap = (1024 - 256) // 2

        def counts() -> dict[str, int]:
            return cluster.api("/api/v1/status")["connections"][cluster.listen]  # type: ignore[no-any-return]

        assert counts()["cap"] == cap and counts()["open"] <= cap
        # Every socket past the cap was closed to make room, or (header_timeout: 1) for
        # sending nothing: once the server has taken them all from its backlog.
        wait_for(
            lambda: counts()["evicted"] + counts()["header_timeouts"] >= 1100 - cap,
            15,
            "the idle sockets past the cap to be closed",
        )
    finally:
        for sock in held:
            sock.close()


def test_a_hundred_thousand_messages_are_refused_at_once(cluster: Cluster, key: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}] * 100_000}
    start = time.monotonic()
    status, _, answer = cluster.post("/v1/chat/completions", json.dumps(body).encode(), key)
    assert status == 400 and answer["error"]["code"] == "too_many_messages"
    assert "gateway.max_messages" in answer["error"]["message"]
    assert time.monotonic() - start < 5


def rss(cluster: Cluster) -> int:
    assert cluster.server is not None
    return int(psutil.Process(cluster.server.popen.pid).memory_info().rss)


def test_oversized_and_unauthenticated_posts_are_refused_before_they_are_read(
    cluster: Cluster,
) -> None:
    idle = rss(cluster)
    chunk = b"x" * (1 << 20)

    def flood(path: str, token: str | None, chunked: bool, out: list[int]) -> None:
        """60 MiB, with its length said or streamed in chunks."""
        sock = connect(cluster)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {60 << 20}\r\n"
        try:
            sock.sendall(head.encode() + b"\r\n")
            for _ in range(60):
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n" if chunked else chunk)
        except OSError:
            pass  # refused and closed before the end: the point
        closed, said = closed_within(sock, 15)
        out.append(int(said[9:12]) if said.startswith(b"HTTP/1.1 ") else 0)
        sock.close()

    statuses: list[int] = []
    token = cluster.admin_token
    floods = [
        ("/api/v1/enroll", None, False),
        ("/api/v1/enroll", None, True),
        ("/api/v1/keys", None, False),
        ("/api/v1/keys", None, True),
        ("/api/v1/keys", token, True),
        ("/api/v1/models", token, False),
        ("/api/v1/enroll", None, True),
        ("/api/v1/keys", None, True),
    ]
    peak = idle
    threads = [threading.Thread(target=flood, args=(*f, statuses)) for f in floods]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(cluster))
        time.sleep(0.05)
    assert sorted(statuses) == [401] * 3 + [413] * 5, statuses
    assert peak - idle < 50 << 20, f"RSS {idle >> 20} MiB idle, {peak >> 20} MiB at peak"


@pytest.mark.parametrize(
    ("path", "body", "field", "words"),
    [
        ("/api/v1/keys", {"name": "k", "rpm": 10**20}, "rpm", "1,000,000,000"),
        ("/api/v1/keys", {"name": "k", "tpm": -1}, "tpm", "from 1"),
        ("/api/v1/keys", {"name": "k", "models": "qwen*"}, "models", "a list"),
        ("/api/v1/keys", {"name": "a\nb"}, "name", "letters, digits"),
        ("/api/v1/keys", {"name": "k", "expires": "soon"}, "expires", "not a date"),
        ("/api/v1/models", {"source": "hf:a/b", "profile": 7}, "profile", "a string"),
        ("/api/v1/models", {"source": "hf:a/b", "memory": -5}, "memory", "from 1"),
        ("/api/v1/models", {"source": "hf:a/b", "selector": ["a"]}, "selector", "object"),
        ("/api/v1/models", {"source": "hf:a/b", "gpus": "2"}, "gpus", "whole number"),
        ("/api/v1/nodes/a/labels", {"set": ["x", "y"]}, "set", "object"),
        ("/api/v1/nodes/a/labels", {"set": {"k": "v w"}}, "set.k", "letters, digits"),
        ("/api/v1/tokens", {"ttl_seconds": 10**30}, "ttl_seconds", "from 1 to 604,800"),
        ("/api/v1/models/tiny/context", {"context": 1.5}, "context", "whole number"),
        ("/api/v1/models/tiny/replicas", {"replicas": 10**9}, "replicas", "from 0 to 1,000"),
    ],
)
def test_every_admin_field_is_checked_by_name(
    cluster: Cluster, path: str, body: dict[str, Any], field: str, words: str
) -> None:
    status, _, answer = cluster.post(path, json.dumps(body).encode(), cluster.admin_token)
    assert status == 400, answer
    assert words in answer["error"]["message"], answer
    assert answer["error"].get("field", "") == field
    # Nothing was kept that would break a listing.
    assert all(k["name"] != "k" for k in cluster.api("/api/v1/keys"))
    assert cluster.api("/api/v1/models")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/v1/keys", "/api/v1/enroll"])
def test_deeply_nested_json_is_a_400_in_json(cluster: Cluster, key: str, path: str) -> None:
    token = key if path.startswith("/v1") else cluster.admin_token
    depth = 5_000 if path.endswith("enroll") else 100_000  # enrollment takes 16 KiB
    status, _, answer = cluster.post(path, b"[" * depth + b"]" * depth, token)
    assert status == 400 and "error" in answer


def test_an_expiry_of_nan_or_infinity_never_reaches_the_store(cluster: Cluster) -> None:
    for raw in (
        b'{"name": "k", "expires": NaN}',
        b'{"name": "k", "expires": Infinity}',
        b'{"name": "k", "expires": 1e309}',
    ):
        status, _, answer = cluster.post("/api/v1/keys", raw, cluster.admin_token)
        assert status == 400 and "not JSON" in answer["error"]["message"]
    assert isinstance(cluster.api("/api/v1/keys"), list)


def test_unauthenticated_routes_answer_401_in_json(cluster: Cluster) -> None:
    for path in ("/api/v1/keys", "/api/v1/status", "/metrics", "/api/v1/models/tiny"):
        req = urllib.request.Request(f"http://{cluster.listen}{path}")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        with info.value as exc:
            assert exc.code == 401 and json.loads(exc.read())["error"]["type"] == "unauthorized"


def test_every_route_but_the_public_ones_wants_the_token(cluster: Cluster) -> None:
    """Walked from the OpenAPI document, which is written from the routes themselves:
    a route added later cannot forget to be guarded."""
    doc = cluster.api("/api/v1/openapi.json", auth=False)
    public = set()
    guarded = 0
    for path, operations in doc["paths"].items():
        if path.startswith("/v1/"):
            continue  # gateway keys, not the admin token: test_gateway.py
        for method, operation in operations.items():
            url = f"http://{cluster.listen}{path.replace('{', '').replace('}', '')}"
            if "security" not in operation:
                public.add(path)
                continue
            for token in (None, "wrong", cluster.admin_token + "x"):
                req = urllib.request.Request(url, method=method.upper(), data=b"{}")
                if token:
                    req.add_header("authorization", f"Bearer {token}")
                with pytest.raises(urllib.error.HTTPError) as info:
                    urllib.request.urlopen(req, timeout=10)
                with info.value as exc:
                    assert exc.code == 401, (method, path)
                    assert json.loads(exc.read())["error"]["type"] == "unauthorized"
            guarded += 1
    assert public == {
        "/healthz",
        "/leader",
        "/api/v1/version",
        "/api/v1/openapi.json",
        "/api/v1/enroll",
        "/api/v1/servers/join",
        # `llmgw login`: a code, then its token once a signed-in person approves it.
        "/api/v1/login/device",
        "/api/v1/login/device/token",
    }
    assert guarded >= 35
