"""``make demo``: a one-machine cluster in ./.demo: control plane, agent, and a tiny model
served by llama.cpp with its own key.

The agent gets its llama.cpp the way every node does: the release this llmgw names
(``llmgw/enginepins.py``), fetched from the release source and checked. Only when that
cannot be reached does the demo build llama-server from source (``--build-command``),
saying so, and hand it to the agent as an engine named on purpose.

Runs in the foreground until Ctrl-C (or exits once serving with ``--exit-when-ready``);
either way the model is stopped before the agent. A second run reuses the same data dir,
so the node is not enrolled twice.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LLMGW = [sys.executable, "-m", "llmgw"]
MODEL = "tiny"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(wanted: int) -> int:
    """``wanted`` when it is free, else (or for 0) a port the system gives."""
    if wanted and port_free(wanted):
        return wanted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, path: str, body: dict[str, Any] | None = None, method: str = "") -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method or ("POST" if body is not None else "GET"),
            headers={"authorization": f"Bearer {self.token}", "content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())


def wait(check: Any, seconds: float, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return None
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.3)
    return None


def tail(log: Path, lines: int = 20) -> str:
    """The last lines of a log, indented, to say why something did not start."""
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return f"  (cannot read it: {exc})"
    return "\n".join(f"  {line}" for line in text.splitlines()[-lines:])


def fetched_or_built(api: Api, node: str, args: argparse.Namespace, root: Path) -> str | None:
    """``installed`` once the agent has the llama.cpp release the fleet names, else the
    path of one built from source (None when neither worked)."""

    def settled() -> dict[str, Any] | None:
        for row in api.call("/api/v1/engines")["nodes"]:
            if row["node"] == node and row["engine"] == "llama.cpp":
                if row["state"] in ("ready", "failed", "configured"):
                    return dict(row)
        return None

    print("fetching llama.cpp the way a node does (the release this llmgw names) ...")
    row = wait(settled, args.fetch_timeout)
    if row and row["state"] in ("ready", "configured"):
        print(f"llama.cpp {row['wanted']} is installed")
        return "installed"
    why = (row or {}).get("message") or f"nothing after {args.fetch_timeout:.0f} s"
    if not args.build_command:
        print(f"llama.cpp could not be fetched ({why}) and no --build-command was given")
        return None
    print(f"llama.cpp could not be fetched ({why});")
    print("building llama-server from source instead (a few minutes on 2 cores) ...")
    with (root / "build.log").open("a") as log:
        built = subprocess.run(
            args.build_command, shell=True, stdout=subprocess.PIPE, stderr=log, text=True
        )
    lines = built.stdout.strip().splitlines()
    if built.returncode != 0 or not lines:
        print(f"building llama-server failed; see {root / 'build.log'}")
        return None
    return lines[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=".demo")
    parser.add_argument(
        "--llama-server",
        help="a llama-server to serve the model with "
        "(`make demo` passes the one `make llama-server` built)",
    )
    parser.add_argument(
        "--release-source", help="where the agent fetches llama.cpp releases (GitHub's layout)"
    )
    parser.add_argument(
        "--build-command",
        help="a shell command that builds llama-server and prints its path last, run only "
        "when the release cannot be fetched (`make demo` passes packaging/build-llama-server.sh)",
    )
    parser.add_argument(
        "--fetch-timeout",
        type=float,
        default=180.0,
        help="seconds to wait for the agent to fetch llama.cpp before building it",
    )
    parser.add_argument("--exit-when-ready", action="store_true")
    args = parser.parse_args()
    root = Path(args.dir).resolve()
    data_dir, state_dir = root / "cp", root / "agent"
    root.mkdir(parents=True, exist_ok=True)

    if not (data_dir / "server.yaml").exists():
        subprocess.run(
            [
                *LLMGW,
                "server",
                "init",
                "--data-dir",
                str(data_dir),
                "--listen",
                f"127.0.0.1:{pick_port(8080)}",
                # The demo's own agent and the control planes' link (the demo has one
                # control plane): any free ports will do (8443 and 8444 may be another
                # llmgw's on this machine).
                "--agent-port",
                str(pick_port(0)),
                "--peer-port",
                str(pick_port(0)),
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
    api = Api(url, token)
    node = socket.gethostname().split(".")[0]
    procs: list[subprocess.Popen[bytes]] = []
    serving = False

    def stop() -> None:
        # A second signal (make passes one on) must not cut the orderly stop short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if serving:
            try:
                # Stopped in the catalog, so the next demo starts it again.
                api.call(f"/api/v1/models/{MODEL}/stop", {})
                wait(
                    lambda: not any(r["model"] == MODEL for r in api.call("/api/v1/replicas")),
                    15,
                )
            except OSError:
                pass
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()

    # Stop cleanly however we are told to: SIGINT even when started from a shell that
    # ignores it for background jobs, SIGTERM and SIGHUP through SystemExit.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        with (root / "server.log").open("a") as log:
            procs.append(
                subprocess.Popen(
                    [*LLMGW, "server", "run", "--data-dir", str(data_dir)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        if not wait(lambda: api.call("/healthz"), 60, procs[0]):
            code = procs[0].poll()
            why = f"it exited with code {code}" if code is not None else "no answer in 60 s"
            print(f"the control plane did not start ({why}); see {root / 'server.log'}:")
            print(tail(root / "server.log"))
            return 1

        agent_cmd = [
            *LLMGW,
            "agent",
            "run",
            "--state-dir",
            str(state_dir),
            "--node-id",
            node,
            "--weights-dir",
            str(root / "weights"),
        ]
        if args.release_source:
            agent_cmd += ["--release-source", args.release_source]
        base_cmd = list(agent_cmd)
        if args.llama_server:
            agent_cmd += ["--engine", f"llama.cpp={args.llama_server}"]
        if not (state_dir / "node.crt").exists():
            join = subprocess.run(
                [*LLMGW, "node", "token", "--data-dir", str(data_dir)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            agent_cmd += ["--server", listen, "--token", join]
        with (root / "agent.log").open("a") as log:
            procs.append(
                subprocess.Popen(
                    agent_cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        if not wait(
            lambda: any(n["state"] == "Ready" for n in api.call("/api/v1/nodes")), 60, procs[1]
        ):
            print(f"the node did not become Ready; see {root / 'agent.log'}")
            return 1
        subprocess.run([*LLMGW, "ctl", "nodes", "--data-dir", str(data_dir)], check=False)
        print()
        print(f"llmgw is running: {url}")
        print(f"  admin API:   {url}/api/v1   (Authorization: Bearer {token})")
        cli = Path(sys.executable).parent / "llmgw"
        print(f"  try:         LLMGW_DATA_DIR={data_dir} {cli} ctl status")

        if not args.llama_server:
            args.llama_server = fetched_or_built(api, node, args, root)
            if args.llama_server is None:
                return 1
            if args.llama_server != "installed":
                # Built from source: the agent runs it as an engine named on purpose.
                procs[1].terminate()
                procs[1].wait(10)
                with (root / "agent.log").open("a") as log:
                    procs[1] = subprocess.Popen(
                        [*base_cmd, "--engine", f"llama.cpp={args.llama_server}"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
        if args.llama_server:
            sys.path.insert(0, str(REPO))
            from tests.support.tinymodel import write_tiny_model

            model = root / "tiny.gguf"
            if not model.exists():
                write_tiny_model(model)
            if any(m["name"] == MODEL for m in api.call("/api/v1/models")):
                api.call(f"/api/v1/models/{MODEL}/start", {})
            else:
                api.call(
                    "/api/v1/models",
                    {"source": str(model), "name": MODEL, "cpu_cores": 1, "replicas": 1},
                )
            serving = True

            def ready() -> dict[str, Any] | None:
                rows = [r for r in api.call("/api/v1/replicas") if r["model"] == MODEL]
                if rows and rows[0]["state"] == "failed":
                    raise SystemExit(f"the model failed to start: {rows[0]['reason']}")
                return rows[0] if rows and rows[0]["state"] == "ready" else None

            row = wait(ready, 120)
            if not row:
                print(f"the model did not start; see {root / 'agent.log'}")
                return 1
            # A gateway key of its own each run: keys are shown once and kept hashed.
            key = api.call("/api/v1/keys", {"name": "demo", "models": [MODEL]})["key"]
            subprocess.run([*LLMGW, "ctl", "models", "--data-dir", str(data_dir)], check=False)
            print()
            print(f"A tiny model is served by llama.cpp (pid {row['pid']}) behind llmgw's /v1:")
            print(f"  URL:         {url}/v1")
            print(f"  API key:     {key}")
            print(
                f"  try:         curl -s {url}/v1/chat/completions "
                f"-H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
                '-d \'{"model":"tiny","messages":[{"role":"user","content":"hello"}],'
                '"max_tokens":8}\''
            )
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
