"""Where ``llmgw wipe`` looks: the system's places, and on the host this user's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.wipe.finding import places


def test_the_host_adds_this_users_own_places_and_a_scratch_root_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_DATA_DIR", "/home/u/llmgw-data")
    monkeypatch.setenv("LLMGW_STATE_DIR", "/home/u/llmgw-state")
    monkeypatch.setenv("LLMGW_CTL_CONFIG", "/home/u/.config/llmgw/ctl.json")
    host = places(tmp_path, on_host=True)
    assert "/home/u/llmgw-data" in host.data_dirs
    assert "/home/u/llmgw-state" in host.state_dirs
    assert "/home/u/.config/llmgw/ctl.json" in host.files
    scratch = places(tmp_path, on_host=False)
    assert "/var/lib/llmgw" in scratch.data_dirs
    assert "/home/u/llmgw-data" not in scratch.data_dirs
    assert "/home/u/llmgw-state" not in scratch.state_dirs
    assert scratch.files == ()


def test_a_dir_an_agent_yaml_names_is_taken_only_when_it_says_llmgw(tmp_path: Path) -> None:
    config = tmp_path / "opt/llmgw/agent.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("state_dir: /data/llmgw-state\nweights_dir: /data\n")
    found = places(tmp_path, on_host=False)
    assert "/data/llmgw-state" in found.state_dirs
    assert "/data" not in found.weights_dirs
