"""Fill in the sha256 of each Linux release archive of the llama.cpp release this llmgw
names (``LLAMACPP_PIN`` in llmgw/enginepins.py), read from GitHub's API, at release time.

    python packaging/pin-engines.py            # print them
    python packaging/pin-engines.py --write    # write them into llmgw/enginepins.py

GitHub gives each release asset a ``digest`` (``sha256:...``) on releases since June
2025. A node checks what it downloads against the pinned digest; an archive with none
pinned is checked against the digest GitHub publishes for it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "llmgw" / "enginepins.py"
API = "https://api.github.com/repos/ggml-org/llama.cpp/releases/tags/{tag}"
LINUX = re.compile(r"^llama-b\d+-bin-ubuntu-[A-Za-z0-9.-]+\.(tar\.gz|zip)$")


def digests(tag: str) -> dict[str, str]:
    req = urllib.request.Request(
        API.format(tag=tag), headers={"Accept": "application/vnd.github+json"}
    )
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
    args = parser.parse_args()
    text = PINS.read_text()
    pin = re.search(r'^LLAMACPP_PIN = "([^"]+)"', text, re.MULTILINE)
    if pin is None:
        print(f"{PINS}: no LLAMACPP_PIN", file=sys.stderr)
        return 1
    found = digests(pin[1])
    if not found:
        print(f"GitHub publishes no Linux archive digests for {pin[1]}", file=sys.stderr)
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
        print(f"written into {PINS}; run `ruff format llmgw/enginepins.py`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
