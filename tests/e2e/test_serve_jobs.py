"""Serve jobs end to end, on one control plane and one agent running the built
llama-server: the weights come over http from a stand-in on loopback that sends them
slowly (so bytes move while `ctl jobs --follow` watches), or sends part and then stops
(so the start timeout, counted from the download's last move, fails the job at fetch)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.e2e.catalog import ctl, ctl_json, join, scheduled
from tests.e2e.cluster import Cluster
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e

# The start timeout: a fetch that has not moved this long fails the job.
START_TIMEOUT = 6
CHUNK = 128 * 1024
# Between chunks of the slow download: its 5.5 MiB take about 4.5 s.
PACE = 0.1
# The agent writes (and reports) what it fetched a MiB at a time, and the tiny model is
# half of one: the file is padded after its last tensor, which llama.cpp never reads.
PADDING = 5 * 1024 * 1024
STEPS = ["resolve", "plan", "place", "fetch", "start", "ready"]


class Hub(ThreadingHTTPServer):
    """Answers /slow/m.gguf and /stall/m.gguf: a bounded Range (the control plane
    reading the GGUF header) at once; the whole file slowly, or three quarters of it and
    then nothing until the test ends."""

    daemon_threads = True

    def __init__(self, content: bytes) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.content = content
        self.done = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Hub

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        content = self.server.content
        if self.path not in ("/slow/m.gguf", "/stall/m.gguf"):
            self.send_error(404)
            return
        ranged = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if ranged:
            start, end = int(ranged[1]), min(int(ranged[2]), len(content) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(content)}")
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            self.wfile.write(content[start : end + 1])
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        stall = self.path.startswith("/stall/")
        for at in range(0, len(content), CHUNK):
            if stall and at >= len(content) * 3 // 4:
                self.server.done.wait()  # sends nothing more
                return
            self.wfile.write(content[at : at + CHUNK])
            self.wfile.flush()
            if self.server.done.wait(PACE):
                return


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    model = write_tiny_model(tmp_path_factory.mktemp("hub") / "m.gguf")
    server = Hub(model.read_bytes() + bytes(PADDING))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.done.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, binary: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path_factory.mktemp("jobs"), f"  start_timeout: {START_TIMEOUT}\n")
    try:
        join(c, "a", binary)
        yield c
    finally:
        c.stop()


def test_ctl_jobs_follow_shows_each_step_and_the_bytes_fetched(cluster: Cluster, hub: Hub) -> None:
    served = ctl_json(
        cluster, "model", "serve", f"{hub.url}/slow/m.gguf", "--name", "slow", "--context", "256"
    )
    job = served["job"]
    assert re.fullmatch(r"job-[0-9a-f]{12}", job)
    followed = ctl(cluster, "jobs", "--follow", job)
    lines = followed.stdout.splitlines()
    assert lines[-1] == "slow is ready", followed.stdout
    # The download seen as it went: bytes of the whole, more than once, with a rate.
    fetched = [
        line for line in lines if re.search(r"a \(slow\.default\.\w+\): [\d.]+ MiB of", line)
    ]
    assert len(fetched) >= 2, followed.stdout
    assert any(" at " in line and "/s" in line for line in fetched), followed.stdout
    # Each step as the job reached it, in order (a step over between two looks is not
    # seen: placing is quick, and so is loading the tiny model).
    seen = list(dict.fromkeys(line.split()[0] for line in lines if line[:1].isalpha()))
    seen = [s for s in seen if s in STEPS]
    assert seen == [s for s in STEPS if s in seen] and {"fetch", "ready"} <= set(seen)
    kept = ctl_json(cluster, "jobs", job)
    assert kept["state"] == "succeeded" and kept["error"] is None
    assert [s["state"] for s in kept["steps"]] == ["done"] * 6
    (node,) = kept["nodes"]
    assert node["node"] == "a" and node["done"] == node["total"] == len(hub.content)
    assert [j["id"] for j in ctl_json(cluster, "jobs", "--model", "slow")] == [job]


def test_a_fetch_that_stalls_past_the_timeout_fails_serve_wait_at_fetch(
    cluster: Cluster, hub: Hub
) -> None:
    waited = ctl(
        cluster,
        "model",
        "serve",
        f"{hub.url}/stall/m.gguf",
        "--name",
        "stalled",
        "--context",
        "256",
        "--wait",
        check=False,
    )
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "serving stalled failed at fetch: not Ready" in waited.stderr
    assert "after it last made progress (state downloading)" in waited.stderr
    (job,) = ctl_json(cluster, "jobs", "--model", "stalled")
    assert job["error"]["step"] == "fetch" and job["steps"][3]["state"] == "failed"
    assert 0 < job["nodes"][0]["done"] < len(hub.content)
