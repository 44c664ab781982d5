"""Cut an llmgw release: ``make release VERSION=X.Y.Z SIGNING_KEY=/path/key.pem``.

Refused, with the tree as it was, when VERSION is not a version, when the signing key's
public half is not one ``llmgw/releasekey.py`` trusts (every llmgw would refuse the
release), when the key file lies inside this repository (it must never enter the tree),
when CHANGELOG.md's ``## Unreleased`` section is empty, or when the llama.cpp digests
``packaging/pin-engines.py --write`` fills in come back empty (nodes would trust whatever
the release source publishes). Then, in order:

1. the pinned engine digests are written into ``llmgw/enginepins.py``;
2. VERSION goes into ``llmgw/__init__.py``;
3. ``## Unreleased`` becomes ``## VERSION - DATE``, under a fresh empty ``## Unreleased``;
4. the zipapp is built (``make zipapp``), or ``--zipapp PATH`` is taken as it is;
5. GitHub's release layout is written under ``dist/releases``::

       download/vVERSION/llmgw-VERSION-TAG.pyz
       download/vVERSION/llmgw-VERSION-TAG.pyz.sha256
       download/vVERSION/SHA256SUMS          (sha256sum's lines)
       download/vVERSION/SHA256SUMS.sig      (base64 Ed25519 signature of SHA256SUMS)

so ``python -m http.server`` in ``dist/releases`` is a release source
(``http://HOST:PORT``), and the files go onto GitHub's release ``vVERSION`` as they are.
A step that fails puts back the files the earlier steps changed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# This tree's llmgw (its releasekey.py, its release.py), not one installed elsewhere.
sys.path.insert(0, str(REPO))

from llmgw import release  # noqa: E402

CHANGELOG = REPO / "CHANGELOG.md"
INIT = REPO / "llmgw" / "__init__.py"
PINS = REPO / "llmgw" / "enginepins.py"
RELEASEKEY = REPO / "llmgw" / "releasekey.py"
UNRELEASED = "## Unreleased"
_INIT_VERSION = re.compile(r'^__version__ = "[^"]*"$', re.MULTILINE)


class Refused(Exception):
    """The release cannot be cut; the message says why and what to do."""


def trusted_keys() -> tuple[str, ...]:
    """The keys this tree's ``releasekey.py`` names (read from the file: it is the one
    the release's zipapp will carry)."""
    return tuple(re.findall(r'"([A-Za-z0-9+/]{43}=)"', RELEASEKEY.read_text()))


def check_key(path: Path) -> bytes:
    """The signing key's PEM, refused when it lies in the tree or is not trusted."""
    resolved = path.expanduser().resolve()
    if resolved.is_relative_to(REPO):
        raise Refused(
            f"the signing key {path} lies inside the repository ({REPO}): keep it outside "
            "the tree, where no commit or build can pick it up"
        )
    try:
        pem = resolved.read_bytes()
    except OSError as exc:
        raise Refused(f"cannot read the signing key {path} ({exc.strerror})") from None
    try:
        public = release.public_key_of(pem)
    except release.ReleaseError:
        raise
    except (ValueError, TypeError):
        raise Refused(
            f"{path} is not a PEM private key (make one with `openssl genpkey -algorithm ed25519`)"
        ) from None
    if public not in trusted_keys():
        raise Refused(
            f"the public key of {path} ({public}) is not in {RELEASEKEY.relative_to(REPO)} "
            "PUBLIC_KEYS: every llmgw would refuse this release. Sign with the release key, "
            "or add this key there one release ahead"
        )
    return pem


def unreleased(text: str) -> tuple[int, int, int]:
    """Where CHANGELOG.md's ``## Unreleased`` line begins, where its body begins, and
    where the body ends (the next ``## `` heading, or the end)."""
    offset = 0
    heading = start = None
    for line in text.splitlines(keepends=True):
        if start is None and line.rstrip() == UNRELEASED:
            heading, start = offset, offset + len(line)
        elif heading is not None and start is not None and line.startswith("## "):
            return heading, start, offset
        offset += len(line)
    if heading is None or start is None:
        raise Refused(f"{CHANGELOG.name} has no `{UNRELEASED}` section to release")
    return heading, start, offset


def moved_changelog(text: str, version: str, date: str) -> str:
    """The Unreleased section's lines under ``## VERSION - DATE``, below a fresh empty
    Unreleased heading."""
    heading, start, end = unreleased(text)
    body = text[start:end]
    if not body.strip():
        raise Refused(
            f"{CHANGELOG.name}: `{UNRELEASED}` is empty; write what this release changes first"
        )
    moved = f"{UNRELEASED}\n\n## {version} - {date}\n{body.rstrip()}\n\n"
    return (text[:heading] + moved + text[end:]).rstrip("\n") + "\n"


def pin_engines(api: str | None) -> None:
    """``pin-engines.py --write``; refused unless every pin then has its digests."""
    command = [sys.executable, str(REPO / "packaging" / "pin-engines.py"), "--write"]
    if api:
        command += ["--api", api]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise Refused(
            "the pinned engine digests could not be filled in "
            f"(packaging/pin-engines.py: {proc.stderr.strip() or proc.returncode}); a "
            "release without them lets nodes trust what the release source publishes"
        )
    if re.search(r'"sha256":\s*\{\s*\}', PINS.read_text()):
        raise Refused(
            f"{PINS.relative_to(REPO)}: the pinned engine digests are empty after "
            "pin-engines.py --write; a release without them is refused"
        )


def build_zipapp(out: Path) -> Path:
    target = out / "llmgw.pyz"
    proc = subprocess.run(["make", "-s", "zipapp", f"ZIPAPP={target}"], cwd=REPO, timeout=900)
    if proc.returncode != 0 or not target.is_file():
        raise Refused(f"`make zipapp` failed ({proc.returncode})")
    return target


def write_layout(out: Path, version: str, zipapp: Path, pem: bytes, tag: str) -> Path:
    """``out/download/vVERSION/`` with the asset, its .sha256, SHA256SUMS and its .sig,
    written in a hidden folder first and renamed into place whole."""
    final = out / "download" / f"v{version}"
    if final.exists():
        raise Refused(f"{final} exists: release {version} was cut already")
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=final.parent))
    try:
        name = release.asset_name(version, tag)
        shutil.copyfile(zipapp, building / name)
        os.chmod(building / name, 0o755)
        digest = release.sha256_file(building / name)
        sums = release.format_sums({name: digest})
        (building / f"{name}.sha256").write_bytes(sums)
        (building / release.SUMS).write_bytes(sums)
        (building / release.SIGNATURE).write_bytes(release.sign(sums, pem))
        os.chmod(building, 0o755)
        building.rename(final)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return final


def cut(args: argparse.Namespace) -> Path:
    try:
        version = str(release.Version.parse(args.version))
    except release.ReleaseError as exc:
        raise Refused(str(exc)) from None
    pem = check_key(Path(args.signing_key))
    out = Path(args.out).resolve() if args.out else REPO / "dist" / "releases"
    if (out / "download" / f"v{version}").exists():
        raise Refused(
            f"{out / 'download' / f'v{version}'} exists: release {version} was cut already"
        )
    changelog = CHANGELOG.read_text() if CHANGELOG.is_file() else ""
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    new_changelog = moved_changelog(changelog, version, date)
    zipapp = Path(args.zipapp).resolve() if args.zipapp else None
    if zipapp is not None and not zipapp.is_file():
        raise Refused(f"--zipapp {args.zipapp}: no such file")
    saved = {path: path.read_bytes() for path in (INIT, CHANGELOG, PINS)}
    try:
        pin_engines(args.api)
        INIT.write_text(_INIT_VERSION.sub(f'__version__ = "{version}"', INIT.read_text()))
        CHANGELOG.write_text(new_changelog)
        if zipapp is None:
            zipapp = build_zipapp(REPO / "dist")
        return write_layout(out, version, zipapp, pem, args.tag or release.platform_tag())
    except BaseException:
        for path, data in saved.items():
            path.write_bytes(data)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", required=True, help="the release's version, X.Y.Z")
    parser.add_argument(
        "--signing-key",
        required=True,
        help="the Ed25519 private key (PEM) the release is signed with, outside the tree",
    )
    parser.add_argument(
        "--zipapp",
        help="sign this already-built zipapp as it is instead of `make zipapp` (tests)",
    )
    parser.add_argument(
        "--api", help="llama.cpp's releases API for pin-engines.py (default GitHub's)"
    )
    parser.add_argument("--out", help="where the release layout goes (default dist/releases)")
    parser.add_argument("--tag", help="the zipapp's platform (default this machine's)")
    args = parser.parse_args(argv)
    try:
        final = cut(args)
    except (Refused, release.ReleaseError) as exc:
        print(f"release: {exc}\nNothing was changed.", file=sys.stderr)
        return 1
    print(f"release {args.version} is in {final}")
    for path in sorted(final.iterdir()):
        print(f"  {path.name}")
    print(f"serve it: cd {final.parents[1]} && python3 -m http.server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
