"""``ctl models explore`` against a real control plane served on loopback
(``tests/support/adminserver.py``) whose cluster ``hf_endpoint`` (``ctl config set``)
points at a hub stand-in: the ``--json`` answers in their shapes (``ExploreJson``,
``ExploreRepoJson``), the table, the API's roles, and a hub that does not answer."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.cli import main
from llmgw.wire import admin
from tests.support.adminserver import Served, serving
from tests.support.hubstandin import HubStandIn
from tests.support.shapes import check


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[Served]:
    with serving(tmp_path / "data") as served:
        yield served


@pytest.fixture
def hub(cp: Served) -> Iterator[HubStandIn]:
    standin = HubStandIn()
    cp.run(standin.__aenter__())
    try:
        yield standin
    finally:
        cp.run(standin.__aexit__())


def ctl(cp: Served, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(["ctl", *argv, "--server", cp.base, "--token", cp.token])
    except SystemExit as exc:
        code = 1 if exc.code else 0
        print(exc.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


def ctl_json(cp: Served, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = ctl(cp, capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_explore_reads_the_clusters_hub_and_answers_its_shapes(
    cp: Served, hub: HubStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl(cp, capsys, "config", "set", "hf_endpoint", hub.url)[0] == 0
    found = ctl_json(cp, capsys, "models", "explore", "qwen")
    check(admin.ExploreJson, found)
    # No node yet: the hub is asked for GGUF only, and nothing fits.
    assert (found["hub"], found["query"], found["gguf_only"]) == (hub.url, "qwen", True)
    assert hub.asked[-1].query["filter"] == "gguf"
    assert found["repos"] and not any(r["verdict"]["fits"] for r in found["repos"])
    assert found["judged_by"]["nodes"] == 0
    repo = ctl_json(cp, capsys, "models", "explore", "--repo", "unsloth/Qwen3-8B-GGUF")
    check(admin.ExploreRepoJson, repo)
    assert [s["name"] for s in repo["sets"]] == ["Q2_K", "Q4_K_M", "Q8_0", "F16"]
    code, out, _ = ctl(cp, capsys, "models", "explore", "--fits")
    assert code == 0 and "Judged by 0 node(s): no cards; no RAM read." in out
    code, out, _ = ctl(cp, capsys, "models", "explore", "llama")
    assert code == 0
    assert re.search(r"unsloth/Llama-3.3-70B-Instruct-GGUF +70.6 B +Q4_K_M +40.2 GiB +no: ", out)
    # `ctl models` alone still lists the catalog.
    assert ctl_json(cp, capsys, "models") == []


def test_only_operators_explore_and_a_silent_hub_is_said(
    cp: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    viewer = cp.person("vic", "viewer")
    answer = httpx.get(
        f"{cp.base}/api/v1/explore", headers={"authorization": f"Bearer {viewer}"}, timeout=10
    )
    assert answer.status_code == 403 and "operator" in answer.json()["error"]["message"]
    stalled = HubStandIn("stall")
    cp.run(stalled.__aenter__())
    cp.cp.explore.timeout = 0.5
    try:
        assert ctl(cp, capsys, "config", "set", "hf_endpoint", stalled.url)[0] == 0
        code, _, err = ctl(cp, capsys, "models", "explore")
    finally:
        cp.run(stalled.__aexit__())
    assert code != 0
    assert f"the hub at {stalled.url} did not answer within 0.5 s" in err
