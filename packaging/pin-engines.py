"""Fill in the sha256 of each Linux release archive of the llama.cpp release this llmgw
names (``LLAMACPP_PIN`` in llmgw/enginepins.py), read from GitHub's API, at release time.

    python packaging/pin-engines.py            # print them
    python packaging/pin-engines.py --write    # write them into llmgw/enginepins.py
    python packaging/pin-engines.py --api URL  # another releases API (a mirror, a test's)

GitHub gives each release asset a ``digest`` (``sha256:...``) on releases since June
2025. A node checks what it downloads against the pinned digest; an archive with none
pinned is checked against the digest GitHub publishes for it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "llmgw" / "enginepins.py"
API = "https://api.github.com/repos/ggml-org/llama.cpp/releases"
LINUX = re.compile(r"^llama-b\d+-bin-ubuntu-[A-Za-z0-9.-]+\.(tar\.gz|zip)$")


def digests(tag: str, api: str = API) -> dict[str, str]:
    """``{archive: sha256}`` of the release ``tag``'s Linux archives, as ``api`` (GitHub's
    releases API of llama.cpp, ``.../releases``) lists them."""
    url = f"{api.rstrip('/')}/tags/{tag}"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.github+json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        release = json.loads(resp.read())
    found: dict[str, str] = {}
    for asset in release.get("assets", []):
        name, digest = str(asset.get("name")), str(asset.get("digest") or "")
        if LINUX.match(name) and digest.startswith("sha256:"):
            found[name] = digest.removeprefix("sha256:")
    return dict(sorted(found.items()))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help="write them into enginepins.py")
    parser.add_argument(
        "--api",
        default=API,
        help=f"llama.cpp's releases API, GitHub's layout (default {API})",
    )
    args = parser.parse_args()
    text = PINS.read_text()
    pin = re.search(r'^LLAMACPP_PIN = "([^"]+)"', text, re.MULTILINE)
    if pin is None:
        print(f"{PINS}: no LLAMACPP_PIN", file=sys.stderr)
        return 1
    try:
        found = digests(pin[1], args.api)
    except (OSError, ValueError) as exc:
        print(f"cannot read {pin[1]}'s digests from {args.api} ({exc})", file=sys.stderr)
        return 1
    if not found:
        print(f"{args.api} publishes no Linux archive digests for {pin[1]}", file=sys.stderr)
        return 1
    print(json.dumps(found, indent=2))
    if args.write:
        entry = f'{{"version": LLAMACPP_PIN, "sha256": {found!r}}}'
        line = f'PINNED: dict[str, dict[str, Any]] = {{"llama.cpp": {entry}}}'
        new, count = re.subn(
            r"^PINNED: dict\[str, dict\[str, Any\]\] = .*$", line, text, flags=re.MULTILINE
        )
        if count != 1:
            print(f"{PINS}: no PINNED line to replace", file=sys.stderr)
            return 1
        PINS.write_text(new)
        # The one line is longer than the tree's style: formatted as `make check` wants it.
        formatted = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--quiet", str(PINS)], capture_output=True
        )
        if formatted.returncode != 0:
            print(f"written into {PINS}; run `ruff format {PINS}`")
        else:
            print(f"written into {PINS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
