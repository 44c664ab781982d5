"""A long fuzz run, for the record in docs/reliability.md: Schemathesis over every admin
route and over /v1 of a real control plane serving the tiny model on a real
llama-server, as the suite's own run (tests/e2e/test_fuzz.py) does in a minute or two.

    .venv/bin/python bench/fuzz.py --minutes 5

Prints, per run: the operations tested, the cases generated, the failures found, and
the minutes it took; then what the control plane's /metrics says of replica failures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e.catalog import ctl_json, join, scheduled, serve, wait_ready  # noqa: E402
from tests.e2e.cluster import free_port  # noqa: E402
from tests.e2e.test_fuzz import replica_failures, schemathesis  # noqa: E402
from tests.support.engines import llama_server_binary  # noqa: E402
from tests.support.tinymodel import write_tiny_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="per run (default 5)")
    args = parser.parse_args()
    seconds = int(args.minutes * 60)
    with tempfile.TemporaryDirectory(prefix="llmgw-fuzz-") as tmp:
        root = Path(tmp)
        os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"  # a hub that fails fast
        cluster = scheduled(root)
        try:
            join(cluster, "a", llama_server_binary())
            serve(cluster, write_tiny_model(root / "tiny.gguf"), "tiny", "--max-output", "4")
            wait_ready(cluster, "tiny", 1)
            key = ctl_json(cluster, "keys", "create", "--name", "fuzzer")["key"]
            runs = [
                ("/v1", key, "^/v1/", ""),
                ("admin API", cluster.admin_token, "^/(api|metrics|healthz)", "/logs$|/serving$"),
            ]
            for name, token, paths, exclude in runs:
                out = root / name.replace(" ", "-").replace("/", "")
                out.mkdir()
                start = time.monotonic()
                found = schemathesis(cluster, token, paths, out, seconds, exclude)
                minutes = (time.monotonic() - start) / 60
                print(
                    f"{name}: {found['operations']} operations, {found['cases']} cases, "
                    f"{len(found['failures'])} failures, {len(found['errors'])} errors, "
                    f"{minutes:.1f} min"
                )
                for problem in found["failures"] + found["errors"]:
                    print("  ", problem[:500])
            print("replica failures:", json.dumps(replica_failures(cluster)) or "none")
            req = urllib.request.Request(
                f"http://{cluster.listen}/api/v1/status",
                headers={"authorization": f"Bearer {cluster.admin_token}"},
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                print("connections:", json.loads(resp.read())["connections"])
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
