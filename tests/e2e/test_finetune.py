"""A fine-tune for real on the CPU, end to end: a tiny Llama-shaped checkpoint the test
writes (random weights) served as GGUF by the built llama-server, 20 pairs, one epoch,
``ctl finetune create`` on the node's agent with the trainer's real environment; the
job reports a loss that falls and its peak memory, the adapter is converted to GGUF and
taken back into the store; ``ctl model adapter add m tuned`` (no source) serves it, the
node fetches it from the control plane, and the real llama-server loads it and answers
``m:tuned`` through the gateway.

The node's trainer environment and llama.cpp's conversion scripts are the ones the
tests make once a machine (``tests/support/tinyhf.py``): linked into the agent's
trainer directory, as a node that made them before finds them there."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from llmgw.agent.finetune import trainenv
from llmgw.enginepins import LLAMACPP_PIN
from tests.e2e.catalog import (
    ctl,
    ctl_json,
    engine_key,
    join,
    replicas,
    scheduled,
    serve,
    wait_ready,
)
from tests.e2e.cluster import Cluster, wait_for
from tests.support import tinyhf

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def write_pairs(path: Path) -> Path:
    """20 pairs, every batch of the one epoch alike (half of them in the chat form), so
    each step's loss is over the same text and falls as the adapter learns it."""
    user = {"role": "user", "content": "what colour is the sky"}
    chat = {"messages": [user, {"role": "assistant", "content": "the sky is blue"}]}
    plain = {"prompt": "what colour is the sky", "completion": "the sky is blue"}
    path.write_text("".join(json.dumps(chat if i % 2 else plain) + "\n" for i in range(20)))
    return path


def seed_trainer(cluster: Cluster, node_id: str) -> None:
    """The node's trainer directory holding the environment and conversion scripts the
    tests made (``ensure_env`` and ``ensure_converter`` find them made)."""
    root = cluster.state_dir(node_id) / "trainer"
    root.mkdir(parents=True, exist_ok=True)
    env = tinyhf.trainer_python().parents[2]  # {env}/venv/bin/python
    (root / env.name).symlink_to(env)
    scripts = tinyhf.converter().parent
    (root / trainenv.converter_directory(root, LLAMACPP_PIN).name).symlink_to(scripts)


def test_a_fine_tune_trains_on_the_cpu_and_is_served_as_an_adapter(
    cluster: Cluster, binary: Path, tmp_path: Path
) -> None:
    hf = tinyhf.write_tiny_hf(tmp_path / "tiny-hf")
    gguf = tinyhf.to_gguf(hf, tmp_path / "tiny.gguf")
    join(cluster, "a", binary)
    seed_trainer(cluster, "a")
    serve(cluster, gguf, "m")
    (first,) = wait_ready(cluster, "m", 1)

    # A GGUF model needs the safetensors checkpoint it was made from: said before any send.
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    refused = ctl(
        cluster,
        "finetune",
        "create",
        "--model",
        "m",
        "--data",
        str(pairs),
        "--name",
        "t",
        check=False,
    )
    assert refused.returncode != 0 and "--base" in refused.stderr
    job = ctl_json(
        cluster,
        "finetune",
        "create",
        "--model",
        "m",
        "--data",
        str(pairs),
        "--name",
        "tuned",
        "--base",
        str(hf),
        "--epochs",
        "1",
        "--rank",
        "8",
        "--mib",
        "256",
    )
    assert job["node"] == "a" and job["device"] == "cpu" and job["pairs"] == 20

    def ended() -> dict[str, Any] | None:
        now: dict[str, Any] = ctl_json(cluster, "finetune", "show", job["id"])
        return now if now["state"] in ("succeeded", "failed", "cancelled") else None

    done = wait_for(ended, 600, f"fine-tune {job['id']} to end", step=1.0)
    assert done["state"] == "succeeded", done["error"]
    loss = done["loss"]
    assert len(loss) == done["steps"] >= 2 and loss[-1] < loss[0], loss
    assert done["peak_mib"] > 0 and done["adapter_bytes"] > 0

    # Served: the node fetches the stored GGUF over its stream; llama-server loads it.
    listed = ctl_json(cluster, "model", "adapter", "add", "m", "tuned")
    assert listed == [{"name": "tuned", "source": "finetune:tuned", "scale": 1.0}]

    def loaded() -> dict[str, Any] | None:
        rows = replicas(cluster, "m")
        for row in rows:
            assert row["state"] != "failed", row["reason"]
        ready = [
            r for r in rows if r["state"] == "ready" and r["replica_id"] != first["replica_id"]
        ]
        return ready[0] if len(rows) == 1 and ready else None

    row = wait_for(loaded, 120, "m's replica with the adapter", step=0.5)
    argv = psutil.Process(row["pid"]).cmdline()
    adapter = argv[argv.index("--lora-scaled") + 1].rsplit(":", 1)[0]
    assert Path(adapter).read_bytes()[:4] == b"GGUF"
    assert Path(adapter).is_relative_to(cluster.state_dir("a") / "finetuned")
    ask = urllib.request.Request(
        f"http://127.0.0.1:{row['port']}/lora-adapters",
        headers={"Authorization": f"Bearer {engine_key(cluster, row['replica_id'])}"},
    )
    with urllib.request.urlopen(ask, timeout=10) as answer:
        assert [a["path"] for a in json.loads(answer.read())] == [adapter]
    key = str(ctl_json(cluster, "keys", "create", "--name", "tester")["key"])
    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key, max_retries=0)
    try:
        reply = sdk.chat.completions.create(
            model="m:tuned",
            messages=[{"role": "user", "content": "what colour is the sky"}],
            max_tokens=4,
            temperature=0,
        )
        # Routed only to a replica that reported the adapter loaded; applied by its id.
        assert reply.choices[0].finish_reason in ("length", "stop")
    finally:
        sdk.close()
