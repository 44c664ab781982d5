"""An air-gapped control plane serving a model from a bundle: the bundle is made from a
loopback hub, llama.cpp release source and llmgw release server, imported into a fresh
control plane's data dir, and that control plane and its agent run in a network
namespace whose only way out is a link to the test, where the hub's address answers
nothing. The agent installs llama.cpp (the test's llama-server packed as a release
archive) from the control plane's mirror and the weights from a mirror on a node of the
island (``llmgw mirror serve``, ``mirror.api``), each checked against what the control
plane sent; the model answers a chat completion from the official openai SDK."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from llmgw.offline.bundle import create
from llmgw.offline.bundleimport import import_bundle
from tests.agent.weights.weights_fakehub import start_hub
from tests.e2e.catalog import SCHEDULING, ctl, ctl_json, wait_ready
from tests.e2e.cluster import Cluster, Proc, spawn, wait_for
from tests.support.bundles import ENGINE_TAG, bundle_sources, plan
from tests.support.engines import LoopThread
from tests.support.netns import inside, ip, reach
from tests.support.ports import free_port
from tests.support.tinymodel import write_tiny_model

pytestmark = pytest.mark.e2e
MODEL = "tiny-Q8_0.gguf"


@dataclass(frozen=True)
class Island:
    """A namespace with loopback and one link to the test (``outside`` is the test's
    end, ``address`` the namespace's); no default route."""

    netns: str
    outside: str
    address: str


@pytest.fixture
def island() -> Iterator[Island]:
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2 (`ip netns`)")
    pid = os.getpid()
    netns, near, far = f"llmgw-offline-{pid}", f"off{pid}o", f"off{pid}i"
    subnet = f"10.251.{pid % 250}"
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)  # a stale one
    try:
        ip("netns", "add", netns)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
    try:
        ip("-n", netns, "link", "set", "lo", "up")
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        ip("link", "set", far, "netns", netns)
        ip("addr", "add", f"{subnet}.1/24", "dev", near)
        ip("link", "set", near, "up")
        ip("-n", netns, "addr", "add", f"{subnet}.2/24", "dev", far)
        ip("-n", netns, "link", "set", far, "up")
        yield Island(netns, f"{subnet}.1", f"{subnet}.2")
    finally:
        subprocess.run(["ip", "link", "del", near], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def test_a_bundle_serves_a_model_on_a_control_plane_with_no_route_to_the_hub(
    tmp_path: Path, island: Island, binary: Path
) -> None:
    loop = LoopThread()
    hub, runner = loop.run(start_hub())
    model = write_tiny_model(tmp_path / "tiny.gguf").read_bytes()
    hub.add("org/tiny-GGUF", MODEL, model)
    members: dict[str, bytes | Path] = {"build/bin/llama-server": binary}
    cluster = Cluster(tmp_path / "cluster", host=island.address)
    cluster.server_prefix = inside(island.netns)
    served: Proc | None = None
    try:
        with bundle_sources(tmp_path / "sources", engine_members=members) as sources:
            made = asyncio.run(
                create(
                    plan(
                        sources,
                        hub.endpoint,
                        tmp_path / "bundle.tar",
                        models=[f"hf:org/tiny-GGUF:{MODEL}"],
                    )
                )
            )
        asked = len(hub.requests)
        cluster.init()
        # `llmgw bundle import`, as an llmgw trusting the test's release key would run it.
        import_bundle(
            made.path,
            cluster.data_dir / "mirror",
            keys=sources.keys,
            manifest_sha256=made.manifest_sha256,
        )
        # A mirror on a "node" of the island (`llmgw mirror serve`), holding the same
        # files: mirror.api, which the shard's weights are sent from.
        import_bundle(made.path, tmp_path / "node-mirror", keys=sources.keys)
        node_mirror = f"http://{island.address}:{free_port()}"
        argv = ["mirror", "serve", "--dir", str(tmp_path / "node-mirror"), "--listen"]
        served = spawn(
            [*argv, node_mirror.removeprefix("http://")],
            cluster.root / "node-mirror.log",
            inside(island.netns),
        )
        config = cluster.data_dir / "server.yaml"
        config.write_text(
            config.read_text()
            + SCHEDULING
            + f"offline:\n  mirror: true\nengines:\n  llama.cpp: {ENGINE_TAG}\n"
            + f"mirror:\n  api: {node_mirror}\n"
        )
        host, mirror_port = node_mirror.removeprefix("http://").split(":")
        wait_for(lambda: reach(island.netns, host, int(mirror_port)) == "answered", 20, "mirror")
        cluster.start_server()
        port = hub.endpoint.rsplit(":", 1)[1]
        # Inside, the hub's address answers nothing, and nothing lies beyond the link.
        assert reach(island.netns, "127.0.0.1", int(port)) == "refused"
        assert reach(island.netns, island.outside, int(port)) == "refused"
        assert reach(island.netns, "1.1.1.1", 443).startswith("error")

        cluster.start_agent("a", cluster.token(), prefix=inside(island.netns))
        cluster.wait_state("a", "Ready", 60)
        ctl(cluster, "model", "serve", f"hf:org/tiny-GGUF:{MODEL}", "--name", "tiny",
            "--context", "256")  # fmt: skip
        try:
            wait_ready(cluster, "tiny", 1, 120)
        except AssertionError:
            print((cluster.root / "agent-a.log").read_text()[-6000:])
            print((cluster.root / "server.log").read_text()[-4000:])
            raise
        key = str(ctl_json(cluster, "keys", "create", "--name", "offline")["key"])
        with openai.OpenAI(
            base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0
        ) as sdk:
            answer = sdk.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
            )
        assert answer.choices[0].message.content
        # The engine came from the mirror, checked against the digest sent over the
        # stream; the weights too; and the hub heard nothing after the bundle was made.
        engines = ctl_json(cluster, "engines")["nodes"]
        assert [(r["node"], r["versions"]) for r in engines] == [("a", [ENGINE_TAG])]
        cached = list((cluster.root / "weights-a").rglob(MODEL))
        assert [p.read_bytes() == model for p in cached] == [True]
        assert len(hub.requests) == asked
        # The shard's spec carried the model file's sha256 from the control plane.
        (record,) = (cluster.state_dir("a") / "shards").glob("*.json")
        spec = json.loads(record.read_text())["spec"]
        assert spec["sha256"] == {MODEL: hashlib.sha256(model).hexdigest()}
        # ...and named the node's mirror, which answered, to fetch them from.
        assert spec["hub"] == f"{node_mirror}/mirror/hf"
        marker = json.loads(
            (
                cluster.state_dir("a") / "engines/llama.cpp" / f"{ENGINE_TAG}-cpu/installed.json"
            ).read_text()
        )
        assert marker["source"].startswith(f"http://{cluster.listen}/mirror/llama.cpp/download/")
    finally:
        if served is not None:
            served.stop()
        cluster.stop()
        loop.run(runner.cleanup())
        loop.close()
