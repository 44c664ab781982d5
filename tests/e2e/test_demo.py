"""``make demo``'s script: a one-machine cluster serving a tiny model behind llmgw's /v1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import openai
import psutil
import pytest

from tests.support.engines import llama_server_binary

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "packaging" / "demo.py"


def test_demo_serves_a_model_and_reuses_its_data_dir(tmp_path: Path) -> None:
    binary = llama_server_binary()
    for _ in range(2):
        out = subprocess.run(
            [
                sys.executable,
                str(DEMO),
                "--dir",
                str(tmp_path),
                "--llama-server",
                str(binary),
                "--exit-when-ready",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "llmgw is running: http://127.0.0.1:" in out.stdout
        assert "Ready" in out.stdout
        url = re.search(r"URL:\s+(\S+)", out.stdout)
        key = re.search(r"API key:\s+(\S+)", out.stdout)
        pid = re.search(r"\(pid (\d+)\)", out.stdout)
        assert url and key and pid, out.stdout
        # The demo stopped its model on the way out: the engine is gone, not orphaned.
        assert (
            not psutil.pid_exists(int(pid.group(1)))
            or psutil.Process(int(pid.group(1))).status() == psutil.STATUS_ZOMBIE
        )
    # One enrollment: the second run came back with the node's own certificate.
    assert (tmp_path / "agent.log").read_text().count("enrolled as node") == 1


def test_demo_model_answers_with_its_key(tmp_path: Path) -> None:
    binary = llama_server_binary()
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--dir", str(tmp_path), "--llama-server", str(binary)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            seen += line
            if "Press Ctrl-C" in line:
                break
        url = re.search(r"URL:\s+(\S+)", seen)
        key = re.search(r"API key:\s+(\S+)", seen)
        assert url and key, seen
        client = openai.OpenAI(base_url=url.group(1), api_key=key.group(1))
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
        assert reply.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url.group(1), api_key="nope").models.list()
    finally:
        proc.send_signal(subprocess.signal.SIGINT)  # type: ignore[attr-defined]
        proc.communicate(timeout=30)
