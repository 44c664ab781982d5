"""Which llmgw ``node add`` and ``server add`` put on a machine.

By default, the release the control plane names (``GET /api/v1/release``: its own
version, and ``releases.source`` in its server.yaml), built for the machine's own Python
and CPU (``release.platform_tag`` from the probe), fetched here into a temporary folder
with ``release.fetch``: its ``SHA256SUMS`` signed by a key this llmgw trusts, the zipapp's
sha256 the signed one. Only then is it copied (and ``copy_script`` checks the sha256
again on the far side), so a tampered or foreign release never reaches the machine.

``--source URL`` takes the release from elsewhere (a mirror); ``--bundle DIR`` from an
offline bundle's directory (``llmgw bundle create -o DIR``: its ``llmgw/`` folder is a
release source in GitHub's layout, checked the same way); ``--zipapp PATH`` copies that
file as it is, unchecked: for development, and said so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw import release
from llmgw.client.admin import AdminClient
from llmgw.client.adminbase import AdminError
from llmgw.client.remote import NodeAddError, NodeFacts, check_node, compiled_for, find_zipapp
from llmgw.offline.manifest import MANIFEST
from llmgw.releasekey import PUBLIC_KEYS


def release_options(p: argparse.ArgumentParser) -> None:
    """``node add``'s and ``server add``'s choice of what to install."""
    p.add_argument(
        "--source",
        metavar="URL",
        help="take the release from this source, GitHub's layout (default: the control plane's "
        "releases.source, or its mirror when offline)",
    )
    p.add_argument(
        "--bundle",
        metavar="DIR",
        help="take the release from this offline bundle's directory (`llmgw bundle create`), "
        "its signature and sha256 checked",
    )
    p.add_argument(
        "--zipapp",
        metavar="PATH",
        help="copy this llmgw.pyz as it is, unchecked (development; default: the release the "
        "control plane names, its signature and sha256 checked)",
    )


def explicit_zipapp(args: argparse.Namespace) -> Path | None:
    """``--zipapp``'s file (refused at once when it is missing), or None: the release."""
    given: str | None = args.zipapp
    return find_zipapp(given) if given else None


def bundle_source(args: argparse.Namespace) -> str | None:
    """``--bundle``'s llmgw releases as a release source (a ``file://`` URL), or None."""
    given: str | None = getattr(args, "bundle", None)
    if not given:
        return None
    root = Path(given)
    if root.is_file():
        raise NodeAddError(
            f"--bundle {given} is a tar: unpack it first (tar -xf) and give its directory, "
            "or `llmgw bundle import` it into the control plane, whose mirror then serves "
            "the release"
        )
    releases = root / "llmgw"
    if not (root / MANIFEST).is_file() or not releases.is_dir():
        raise NodeAddError(
            f"--bundle {given} is not a bundle's directory (no {MANIFEST} and llmgw/ in it): "
            "make one with `llmgw bundle create -o DIR`"
        )
    return releases.resolve().as_uri()


def zipapp_for(
    args: argparse.Namespace,
    client: AdminClient,
    facts: NodeFacts,
    host: str,
    *,
    systemd: bool,
    into: Path,
    explicit: Path | None,
    keys: tuple[str, ...] = PUBLIC_KEYS,
) -> Path:
    """The file to copy to ``host``, checked against what the machine runs: ``explicit``
    as it is, else the control plane's release fetched into ``into`` (its signature by one
    of ``keys``: this llmgw's own)."""
    if explicit is not None:
        check_node(facts, host, compiled_for(explicit), systemd=systemd)
        print(
            f"    --zipapp: copying {explicit} as it is, unchecked (for development; without "
            "--zipapp the machine gets the release the control plane names)"
        )
        return explicit
    check_node(facts, host, None, systemd=systemd)
    python = facts.unit_python if systemd else facts.python
    tag = release.platform_tag(python, facts.machine or None)
    try:
        named = client.release()
    except AdminError as exc:
        if exc.status == 404:
            raise NodeAddError(
                "the control plane names no llmgw release (it is older than this llmgw): "
                "pass --zipapp PATH to copy a zipapp as it is"
            ) from None
        raise
    source: str = bundle_source(args) or getattr(args, "source", None) or named["source"]
    version = named["version"]
    print(
        f"==> fetching llmgw {version} for {tag} from {source} (its signature and sha256 checked)",
        flush=True,
    )
    try:
        fetched = release.fetch(source, version, into, tag=tag, keys=keys)
    except release.ReleaseError as exc:
        raise NodeAddError(
            f"llmgw {version} for {tag} from {source} was refused: {exc}. Nothing was copied "
            f"to {host}. Give --source URL for a release source that has it, or --zipapp "
            "PATH to copy a zipapp as it is"
        ) from None
    final = into / fetched.name
    fetched.path.rename(final)
    # The release's own modules, built for that Python and machine, must fit it.
    check_node(facts, host, compiled_for(final), systemd=systemd)
    print(f"    llmgw {version} ({fetched.name}, sha256 {fetched.sha256[:12]}…) checked")
    return final
