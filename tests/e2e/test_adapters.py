"""A LoRA adapter served by name on a real llama-server: added to a model, fetched by the
node, loaded unapplied, applied per request through the gateway with the openai SDK
(as ``MODEL:ADAPTER`` and by its own name), listed in /v1/models, held to keys'
allowlists, counted, and removed again."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

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
from tests.support.tinymodel import LORA_WORD, write_tiny_lora

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = scheduled(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def key(cluster: Cluster, *extra: str) -> str:
    return str(ctl_json(cluster, "keys", "create", "--name", "tester", *extra)["key"])


def replaced(cluster: Cluster, fingerprint: str) -> dict[str, Any]:
    """The model's one replica once it runs ``fingerprint``, Ready (the old one gone)."""

    def check() -> dict[str, Any] | None:
        rows = replicas(cluster, "tiny")
        for row in rows:
            if row["state"] == "failed":
                raise AssertionError(f"{row['replica_id']} failed: {row['reason']}")
        done = len(rows) == 1 and rows[0]["fingerprint"] == fingerprint
        return rows[0] if done and rows[0]["state"] == "ready" else None

    return wait_for(check, 90, f"tiny's replica at {fingerprint}", step=0.2)  # type: ignore[no-any-return]


def engine_get(cluster: Cluster, row: dict[str, Any], path: str) -> Any:
    ask = urllib.request.Request(
        f"http://127.0.0.1:{row['port']}{path}",
        headers={"Authorization": f"Bearer {engine_key(cluster, row['replica_id'])}"},
    )
    with urllib.request.urlopen(ask, timeout=10) as answer:
        return json.loads(answer.read())


def say(sdk: openai.OpenAI, model: str) -> str:
    reply = sdk.chat.completions.create(model=model, messages=HELLO, max_tokens=6, temperature=0)
    return reply.choices[0].message.content or ""


def test_an_adapter_is_asked_for_by_name_and_applied_by_the_engine(
    cluster: Cluster, binary: Path, model: Path, tmp_path: Path
) -> None:
    join(cluster, "a", binary)
    serve(cluster, model, "tiny")
    (first,) = wait_ready(cluster, "tiny", 1)
    lora = write_tiny_lora(tmp_path / "says.gguf")

    listed = ctl_json(cluster, "model", "adapter", "add", "tiny", "says", str(lora))
    assert listed == [{"name": "says", "source": str(lora), "scale": 1.0}]
    assert ctl_json(cluster, "model", "adapter", "list", "tiny") == listed
    shown = ctl_json(cluster, "model", "show", "tiny")
    assert shown["adapters"] == listed
    # The replica is replaced by one that loaded the adapter, unapplied.
    row = replaced(cluster, shown["profiles"][0]["fingerprint"])
    assert row["replica_id"] != first["replica_id"]
    argv = psutil.Process(row["pid"]).cmdline()
    assert argv[argv.index("--lora-scaled") + 1] == f"{lora}:0"
    assert "--lora-init-without-apply" in argv
    loaded = engine_get(cluster, row, "/lora-adapters")
    assert [(a["id"], a["path"], a["scale"]) for a in loaded] == [(0, str(lora), 0.0)]

    sdk = openai.OpenAI(base_url=f"http://{cluster.listen}/v1", api_key=key(cluster), max_retries=0)
    try:
        # At temperature 0 the adapter, applied, makes the model say one word only; the
        # model's own name is answered without it.
        adapted = say(sdk, "tiny:says")
        assert adapted.split() == [LORA_WORD] * len(adapted.split()) and adapted.split()
        assert say(sdk, "says") == adapted
        base = say(sdk, "tiny")
        assert base != adapted and LORA_WORD not in base.split()
        listing = {m.id: m.to_dict() for m in sdk.models.list()}
        assert listing["says"]["parent"] == "tiny" and "tiny" in listing
        with pytest.raises(openai.NotFoundError):
            say(sdk, "tiny:nothing")
    finally:
        sdk.close()

    # A key allowed the model alone may not use its adapter, by either name.
    limited = openai.OpenAI(
        base_url=f"http://{cluster.listen}/v1",
        api_key=key(cluster, "--models", "tiny"),
        max_retries=0,
    )
    try:
        assert say(limited, "tiny") == base
        for name in ("tiny:says", "says"):
            with pytest.raises(openai.NotFoundError):
                say(limited, name)
        assert [m.id for m in limited.models.list()] == ["tiny"]
    finally:
        limited.close()

    # Usage is counted under the adapter's own name, on the replica that served it.
    usage = cluster.api("/api/v1/usage?days=1")
    by_model = {(u["model"], u["replica"]): u["requests"] for u in usage}
    assert by_model[("says", row["replica_id"])] == 2

    # Removed: the replica is replaced without it, and its names mean nothing.
    assert ctl_json(cluster, "model", "adapter", "remove", "tiny", "says") == []
    row = replaced(
        cluster, ctl_json(cluster, "model", "show", "tiny")["profiles"][0]["fingerprint"]
    )
    assert "--lora-scaled" not in psutil.Process(row["pid"]).cmdline()
    out = ctl(cluster, "model", "adapter", "list", "tiny").stdout
    assert "has no LoRA adapters" in out
