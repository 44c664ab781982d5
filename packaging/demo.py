"""``make demo``: a one-machine cluster in ./.demo: control plane, agent, node Ready.

Runs in the foreground until Ctrl-C (or exits once Ready with ``--exit-when-ready``). A
second run reuses the same data dir, so the node is not enrolled twice.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LLMGW = [sys.executable, "-m", "llmgw"]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(wanted: int) -> int:
    if port_free(wanted):
        return wanted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, token: str) -> object:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=3) as resp:
        return json.loads(resp.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=".demo")
    parser.add_argument("--exit-when-ready", action="store_true")
    args = parser.parse_args()
    root = Path(args.dir).resolve()
    data_dir, state_dir = root / "cp", root / "agent"
    root.mkdir(parents=True, exist_ok=True)

    if not (data_dir / "server.yaml").exists():
        http, agent = pick_port(8080), pick_port(8443)
        subprocess.run(
            [
                *LLMGW,
                "server",
                "init",
                "--data-dir",
                str(data_dir),
                "--listen",
                f"127.0.0.1:{http}",
                "--agent-port",
                str(agent),
                "--yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    listen = next(
        line.split(":", 1)[1].strip()
        for line in (data_dir / "server.yaml").read_text().splitlines()
        if line.startswith("listen:")
    )
    token = (data_dir / "admin.token").read_text().strip()
    url = f"http://{listen}"

    procs: list[subprocess.Popen[bytes]] = []

    def stop(*_: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server_log = (root / "server.log").open("a")
        procs.append(
            subprocess.Popen(
                [*LLMGW, "server", "run", "--data-dir", str(data_dir)],
                stdout=server_log,
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                get(f"{url}/healthz", token)
                break
            except OSError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    print(f"the control plane did not start; see {root / 'server.log'}")
                    return 1
                time.sleep(0.2)

        agent_cmd = [
            *LLMGW,
            "agent",
            "run",
            "--state-dir",
            str(state_dir),
            "--node-id",
            socket.gethostname().split(".")[0],
        ]
        if not (state_dir / "node.crt").exists():
            join = subprocess.run(
                [*LLMGW, "node", "token", "--data-dir", str(data_dir)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            agent_cmd += ["--server", listen, "--token", join]
        agent_log = (root / "agent.log").open("a")
        procs.append(subprocess.Popen(agent_cmd, stdout=agent_log, stderr=subprocess.STDOUT))

        deadline = time.monotonic() + 60
        while True:
            nodes = get(f"{url}/api/v1/nodes", token)
            if isinstance(nodes, list) and any(n["state"] == "Ready" for n in nodes):
                break
            if time.monotonic() > deadline or procs[1].poll() is not None:
                print(f"the node did not become Ready; see {root / 'agent.log'}")
                return 1
            time.sleep(0.3)

        subprocess.run([*LLMGW, "ctl", "nodes", "--data-dir", str(data_dir)], check=False)
        print()
        print(f"llmgw is running: {url}")
        print(f"  admin API:   {url}/api/v1   (Authorization: Bearer {token})")
        cli = Path(sys.executable).parent / "llmgw"
        print(f"  try:         LLMGW_DATA_DIR={data_dir} {cli} ctl status")
        print("  The OpenAI-compatible /v1 with a model served by llama.cpp arrives with the")
        print("  engines and gateway work; for now the demo stops at a Ready node.")
        print(f"  logs:        {root}/server.log, {root}/agent.log")
        if args.exit_when_ready:
            return 0
        print("Press Ctrl-C to stop.")
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        print("a process exited; see the logs")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop()


if __name__ == "__main__":
    sys.exit(main())
