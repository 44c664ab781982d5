"""``make demo``'s script brings a one-machine cluster to a Ready node, twice over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "packaging" / "demo.py"


def test_demo_reaches_ready_and_reuses_its_data_dir(tmp_path: Path) -> None:
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, str(DEMO), "--dir", str(tmp_path), "--exit-when-ready"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "llmgw is running: http://127.0.0.1:" in out.stdout
        assert "Ready" in out.stdout
    # One enrollment: the second run came back with the node's own certificate.
    assert (tmp_path / "agent.log").read_text().count("enrolled as node") == 1
