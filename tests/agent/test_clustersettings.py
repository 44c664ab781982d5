"""The cluster's settings on a node: kept in the state dir, the file over the node's layer
over the default, refused whole when they do not build, reported with their sources."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.agent.clustersettings import FILE, ClusterSettings, summary
from llmgw.config import AgentConfig, build


def test_the_file_wins_then_the_node_then_the_cluster_then_the_default(tmp_path: Path) -> None:
    file = {"node_id": "gpu01", "engine_user": "from-file"}
    settings = ClusterSettings(tmp_path, file)
    identity = build(AgentConfig, file, "agent.yaml")
    default = {"engine_user": "from-cluster", "discovery": {"slow_interval": 7}}
    node = {"discovery": {"nvidia_smi": "/opt/nv/nvidia-smi"}, "hf_endpoint": "http://hub"}
    assert settings.accept(1, default, node)  # what runs changes: start again
    running = settings.config(identity)
    assert running.node_id == "gpu01" and running.engine_user == "from-file"
    assert running.discovery.slow_interval == 7
    assert running.discovery.nvidia_smi == "/opt/nv/nvidia-smi"
    assert running.hf_endpoint == "http://hub"
    values = settings.report(running)["values"]
    assert values["engine_user"] == {"value": "from-file", "source": "file"}
    assert values["discovery.slow_interval"] == {"value": 7.0, "source": "cluster"}
    assert values["hf_endpoint"] == {"value": "http://hub", "source": "node"}
    assert values["heartbeat_interval"] == {"value": 5.0, "source": "default"}
    assert "node_id" not in values  # identity is the file's alone

    # Kept: an agent started again (or cut off from its control plane) has them.
    again = ClusterSettings(tmp_path, file)
    assert again.version == 1 and again.config(identity) == running
    # The same layers again change nothing; a new version that runs the same is taken
    # without a restart.
    assert not again.accept(1, default, node)
    assert not again.accept(2, {**default, "engine_user": "other"}, node)  # the file wins
    assert again.version == 2


def test_layers_that_do_not_build_are_refused_and_the_last_good_kept(tmp_path: Path) -> None:
    settings = ClusterSettings(tmp_path, {})
    assert settings.accept(1, {"heartbeat_interval": 2.0}, {})
    assert not settings.accept(2, {"heartbeat_interval": "soon"}, {})
    assert settings.version == 1 and settings.problem and "heartbeat_interval" in settings.problem
    saved = json.loads((tmp_path / FILE).read_text())
    assert saved == {"version": 1, "default": {"heartbeat_interval": 2.0}, "node": {}}
    assert settings.report(settings.config(AgentConfig()))["problem"] == settings.problem


def test_doctor_says_what_is_not_a_default_and_where_it_came_from(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text("engine_user: llm\n")
    ClusterSettings(tmp_path, {}).accept(3, {"discovery": {"slow_interval": 30}}, {})
    good, said = summary(tmp_path)
    assert good
    assert said == (
        'the cluster\'s settings version 3; engine_user="llm" (file); '
        "discovery.slow_interval=30.0 (cluster)"
    )
    (tmp_path / "agent.yaml").write_text("heartbeat_interval: never\n")
    good, said = summary(tmp_path)
    assert not good and "heartbeat_interval" in said
