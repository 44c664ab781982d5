"""A hung ``nvidia-smi`` costs the node nothing but its card figures, end to end.

An agent whose ``nvidia-smi`` (first on its PATH; NVML is absent on this machine, so the
agent reads nvidia-smi as on a node whose NVML is broken) prints a real 8x H100 capture,
then hangs, then answers again. While it hangs the heartbeats keep their 5 s pace (age
under 7 s) and the node stays Ready; within 15 s the cards' figures are stale in the
API and gone from /metrics, and a warning names nvidia-smi, since when and its fix; no
more than one nvidia-smi runs at a time. When it answers again, figures and warning
recover. ``discovery.read_deadline`` is its default, 5 s: the worst case from the hang
to the control plane is one read interval (5 s) and the deadline, the heartbeat going
at once with the news.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_for

CAPTURE = (
    Path(__file__).parent.parent
    / "agent"
    / "fixtures"
    / "smi"
    / "h100-hgx_8cards_580.105.08_verbatim.xml"
)
NODE = "gpu-node"
TEMPERATURES = [29, 30, 29, 32, 32, 29, 31, 29]


def stand_in(bin_dir: Path) -> Path:
    """``nvidia-smi`` printing the capture for ``-q -x``, failing anything else the way
    a driverless one does; ``hang`` in the mode file makes every run sleep a minute.
    Each run appends its pid to ``pids``."""
    bin_dir.mkdir()
    (bin_dir / "mode").write_text("ok\n")
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo $$ >> "{bin_dir}/pids"\n'
        f'if [ "$(cat "{bin_dir}/mode")" = hang ]; then exec sleep 60; fi\n'
        'case "$*" in\n'
        f'  "-q -x") cat "{CAPTURE}" ;;\n'
        '  *) echo "unexpected arguments: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return script


def alive(bin_dir: Path) -> int:
    """The stand-in's runs not yet ended and reaped."""
    count = 0
    for pid in (bin_dir / "pids").read_text().split():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            continue
        count += 1
    return count


def temperature_samples(cluster: Cluster) -> list[str]:
    ask = urllib.request.Request(
        f"http://{cluster.listen}/metrics",
        headers={"Authorization": f"Bearer {cluster.admin_token}"},
    )
    with urllib.request.urlopen(ask, timeout=10) as answer:
        text = answer.read().decode()
    prefix = f'llmgw_gpu_temperature_celsius{{node="{NODE}",'
    return [line for line in text.splitlines() if line.startswith(prefix)]


def smi_warnings(node: dict[str, Any]) -> list[str]:
    return [w for w in node["warnings"] if w.startswith("nvidia-smi:")]


def temperatures(node: dict[str, Any]) -> list[int | None]:
    cards = sorted(node["gpus"], key=lambda g: g["index"])
    return [g.get("temperature") for g in cards]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A control plane at the shipped heartbeat of 5 s (NotReady after 15 s without)."""
    c = Cluster(tmp_path, heartbeat_interval=5.0)
    c.init()
    c.start_server()
    try:
        yield c
    finally:
        c.stop()


def test_a_hung_nvidia_smi_leaves_the_node_ready_and_its_figures_absent(
    cluster: Cluster, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    cluster.start_agent(NODE, cluster.token(), env=env)

    def live_cards() -> dict[str, Any] | None:
        node = cluster.nodes().get(NODE)
        if node and node["state"] == "Ready" and len(node["gpus"]) == 8:
            if node["stale_figures"] == [] and "gpus" in node["figure_ages"]:
                return node
        return None

    node = wait_for(live_cards, 60, "the node's eight cards, live")
    assert temperatures(node) == TEMPERATURES and node["gpu_source"] == "nvidia-smi"
    assert len(temperature_samples(cluster)) == 8
    assert smi_warnings(node) == []

    (bin_dir / "mode").write_text("hang\n")
    hung_at = time.time()
    absent_after: float | None = None
    beats: set[float] = set()
    most_alive = 0
    # Watched until the node has sent five heartbeats since its figures went: 25 s and
    # more of a hung nvidia-smi, well past the 15 s a missed beat would take it out.
    while absent_after is None or len(beats) < 5:
        node = cluster.nodes()[NODE]
        age = time.time() - node["last_seen"]
        assert node["state"] == "Ready", node["reason"]
        assert age < 7, f"the last heartbeat is {age:.1f} s old"
        most_alive = max(most_alive, alive(bin_dir))
        assert most_alive <= 1, "a second nvidia-smi started while one hung"
        gone = "gpus" in node["stale_figures"] and not temperature_samples(cluster)
        if absent_after is None and gone:
            absent_after = time.time() - hung_at
            said = smi_warnings(node)
            assert len(said) == 1 and said[0].startswith("nvidia-smi: no answer in 5 s"), said
            assert "(since " in said[0] and "Fix: run `nvidia-smi` by hand" in said[0]
            assert node["figure_ages"]["gpus"] > 5  # the last good read, with its age
        elif absent_after is not None:
            assert gone and len(smi_warnings(node)) == 1
            beats.add(node["last_seen"])
        assert time.time() - hung_at < 60, "the cards' figures never went absent"
        time.sleep(0.5)
    assert absent_after < 15, f"the figures went absent only after {absent_after:.1f} s"
    assert int((bin_dir / "pids").read_text().count("\n")) >= 2  # it was tried again

    (bin_dir / "mode").write_text("ok\n")

    def recovered() -> dict[str, Any] | None:
        node = cluster.nodes()[NODE]
        if node["stale_figures"] or smi_warnings(node):
            return None
        return node if temperature_samples(cluster) else None

    node = wait_for(recovered, 30, "the cards' figures and no nvidia-smi warning")
    assert temperatures(node) == TEMPERATURES and node["state"] == "Ready"
    assert len(temperature_samples(cluster)) == 8
