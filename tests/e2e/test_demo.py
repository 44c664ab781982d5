"""``make demo``'s script: a one-machine cluster serving a tiny model behind llmgw's /v1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import openai
import psutil
import pytest

from llmgw.enginepins import LLAMACPP_PIN
from tests.support.engines import Mirror, llama_server_binary

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


def run_demo(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMO), "--dir", str(root), *args, "--exit-when-ready"],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_demo_fetches_the_pinned_llama_cpp_the_way_a_node_does(tmp_path: Path) -> None:
    """The release this llmgw names, from the release source, checked and installed by the
    agent itself: nothing is built."""
    mirror = Mirror(tmp_path / "mirror")
    try:
        mirror.publish(LLAMACPP_PIN, {"build/bin/llama-server": llama_server_binary()})
        out = run_demo(
            tmp_path / "demo", "--release-source", mirror.url, "--build-command", "false"
        )
    finally:
        mirror.close()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"llama.cpp {LLAMACPP_PIN} is installed" in out.stdout
    assert "building llama-server from source" not in out.stdout
    pid = re.search(r"\(pid (\d+)\)", out.stdout)
    assert pid and "URL:" in out.stdout, out.stdout
    installed = tmp_path / "demo" / "agent" / "engines" / "llama.cpp" / f"{LLAMACPP_PIN}-cpu"
    assert (installed / "installed.json").is_file()


def test_demo_builds_from_source_only_when_the_release_cannot_be_reached(tmp_path: Path) -> None:
    binary = llama_server_binary()
    out = run_demo(
        tmp_path,
        "--release-source",
        "http://127.0.0.1:9/releases",  # nothing listens: refused at once
        "--build-command",
        f"echo building; echo {binary}",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout
    assert (
        "llama.cpp could not be fetched (install failed: the release source did not answer" in said
    )
    assert "building llama-server from source instead" in said
    assert re.search(r"URL:\s+\S+/v1", said), said


def test_the_demo_tests_are_one_group_that_xdist_keeps_on_one_worker(
    request: pytest.FixtureRequest,
) -> None:
    # Two demos at once would fight over 8080 and the host's nftables table.
    mark = request.node.get_closest_marker("xdist_group")
    assert mark is not None and mark.args == ("host-firewall",)
    if request.config.getoption("dist", "no") == "loadgroup":
        assert request.node.nodeid.endswith("@host-firewall"), request.node.nodeid
