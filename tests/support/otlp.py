"""An OTLP/HTTP trace receiver for the tests: what an OpenTelemetry collector would get.

A real HTTP server on a free loopback port, in a thread of its own (the control plane and
agents under test may be other processes), that decodes each POST to /v1/traces as an
``ExportTraceServiceRequest`` with opentelemetry-proto and keeps its spans, flattened to
``Received``. ``BlackHole`` is the collector that is down in the worst way: it takes the
connection and never answers.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

Value = str | int | float | bool | None


def _value(v: AnyValue) -> Value:
    which = v.WhichOneof("value")
    if which is None:
        return None
    found: Value = getattr(v, which)
    return found


@dataclass(frozen=True)
class Received:
    """One span as it arrived: ids in hex, as the logs and a backend show them."""

    service: str
    instance: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Value]
    status: int  # 0 unset, 1 ok, 2 error
    events: tuple[str, ...]
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    port: int = 0
    spans: list[Received] = field(default_factory=list)
    posts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        found: list[Received] = []
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(
                        Received(
                            service=str(resource.get("service.name", "")),
                            instance=str(resource.get("service.instance.id", "")),
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            status=s.status.code,
                            events=tuple(e.name for e in s.events),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self.lock:
            self.spans.extend(found)
            self.posts += 1

    def named(self, name: str) -> list[Received]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def wait(self, check: Callable[[list[Received]], object], timeout: float, what: str) -> object:
        """``check``'s first true answer over the spans so far, within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = list(self.spans)
            found = check(spans)
            if found:
                return found
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"no {what} within {timeout:g} s; spans: {names}")
            time.sleep(0.05)


@contextmanager
def receiver() -> Iterator[Receiver]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            got.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the test says what it found

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    got.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class BlackHole:
    """A port that takes connections and never answers; ``accepted`` counts them."""

    port: int = 0
    accepted: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.2)
    hole.port = sock.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)
            hole.accepted += 1

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield hole
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        sock.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
