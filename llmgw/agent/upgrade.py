"""The agent's part of ``llmgw ctl upgrade``: the control plane's ``upgrade`` request
(``{version, source, sha256, asset}``) answered, then this agent started again on it.

The release is fetched beside the zipapp this agent runs from and checked (the signed
sums, and the sha256 the control plane names), swapped in by rename with the old one
kept beside it, and started once (``--version``: shiv unpacks it, and one that does not
start is swapped back out; ``llmgw.release``). Only then is the request answered ok,
and once the answer has had its moment to leave, the agent starts again in place
(``llmgw.reexec``): the same process, so its engines stay its children and the new
agent adopts them, serving all along. Any failure is answered with its words and
changes nothing: the agent goes on as it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from llmgw import __version__, release, releasekey
from llmgw.wire.messages import Message, Request, Response

log = logging.getLogger("llmgw.agent")

FEATURE = "upgrade.v1"
# The answer is written to the stream's socket as it is sent; this is its moment to
# leave before the process is replaced (the control plane waits for the node's return
# either way, so a lost answer costs a timeout, never a wrong state).
LINGER = 0.5


class Refused(Exception):
    """An upgrade this agent cannot do, in words."""


def target_of(args: dict[str, object]) -> tuple[str, str, str | None]:
    """The version, source and sha256 of an ``upgrade`` request, or Refused."""
    version, source, sha256 = args.get("version"), args.get("source"), args.get("sha256")
    if not isinstance(version, str) or not isinstance(source, str) or not source:
        raise Refused("an upgrade request names a version and a release source")
    if sha256 is not None and not isinstance(sha256, str):
        raise Refused("an upgrade request's sha256 is hex text")
    try:
        version = str(release.Version.parse(version))
    except release.ReleaseError as exc:
        raise Refused(str(exc)) from None
    if args.get("asset") != release.asset_name(version):
        # The control plane named the sha256 of its own platform's build, not this one's:
        # the signed sums alone vouch for this node's.
        sha256 = None
    return version, source, sha256 or None


def install(
    version: str,
    source: str,
    sha256: str | None,
    zipapp: Path | None,
) -> Path:
    """Fetch, check and swap in ``version`` in place of ``zipapp``; where the old one is
    kept. Blocking (run it in a thread)."""
    if zipapp is None:
        raise Refused(
            "this agent does not run from a zipapp (a source or pip install): upgrade it "
            "with the installer it came from, then restart it"
        )
    fetched = release.fetch(
        source, version, zipapp.parent, keys=releasekey.PUBLIC_KEYS, expect_sha256=sha256
    )
    return release.swap_in_started(fetched, zipapp, __version__)


async def answer(
    req: Request, emit: Callable[[Message], None], restart: Callable[[], None]
) -> None:
    """Answer ``req`` (an ``upgrade``), and on success start again on the version."""
    try:
        version, source, sha256 = target_of(req.args)
        if version == __version__:
            emit(Response(id=req.id, result={"version": version, "restarting": False}))
            return
        log.info("upgrading this agent from %s to %s (from %s)", __version__, version, source)
        kept = await asyncio.to_thread(install, version, source, sha256, release.running_zipapp())
    except (Refused, release.ReleaseError) as exc:
        log.warning("upgrade to %s refused: %s", req.args.get("version"), exc)
        emit(Response(id=req.id, ok=False, error=str(exc)))
        return
    log.info("llmgw %s is in place (%s kept); starting again", version, kept.name)
    emit(Response(id=req.id, result={"version": version, "restarting": True}))
    await asyncio.sleep(LINGER)
    restart()
