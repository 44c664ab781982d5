"""The control plane's part of the offline mirror (``offline.mirror``): its files are
``offline/mirrorfiles.py``'s, served at ``/mirror/`` on its listener; here is what the
agents are given of it (their llama.cpp release source and hub, the mirror's engine
digests over the stream) and how the control plane reaches itself; and the mirrors beyond
it (``mirror.api``, ``mirror.peers``: ``llmgw mirror serve`` on nodes), asked every 15 s
whether they answer, a shard's files sent from a live one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import aiohttp

from llmgw.config import MirrorConfig, format_hostport, parse_hostport
from llmgw.modelkit.sources import SourceError, parse_source
from llmgw.offline.manifest import INDEX, BundleError, parse_manifest
from llmgw.offline.mirrorfiles import ENGINES, PREFIX, MirrorFiles, mirror_urls
from llmgw.wire.messages import WantedEngines

log = logging.getLogger("llmgw.mirror")


def self_url(listen: str) -> str:
    """How this control plane reaches its own listener (``0.0.0.0`` is not an address)."""
    host, port = parse_hostport(listen)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{format_hostport(host, port)}"


def offline_defaults(default: dict[str, object], base: str) -> dict[str, object]:
    """The cluster's default agent settings with the mirror as the agents' llama.cpp
    release source and hub, under what an operator set (``ctl config``)."""
    urls = mirror_urls(base)
    return {"release_source": urls["release_source"], "hf_endpoint": urls["hf_endpoint"], **default}


def with_mirror_digests(message: WantedEngines, mirror: MirrorFiles) -> WantedEngines:
    """``message`` with each llama.cpp archive the mirror holds for the wanted release
    named by its sha256 (a pin the fleet set stays over it): the agent checks what it
    fetches from the mirror against what came over its stream, not against the
    ``.sha256`` the mirror serves beside it."""
    want = message.engines.get(ENGINES)
    if not want or not isinstance(want.get("version"), str):
        return message
    digests = mirror.engine_digests(str(want["version"]))
    if not digests:
        return message
    pinned = want.get("sha256") if isinstance(want.get("sha256"), dict) else {}
    engines = dict(message.engines)
    engines[ENGINES] = {**want, "sha256": {**digests, **(pinned or {})}}
    return replace(message, engines=engines)


def offline_pushed(
    mirror: MirrorFiles | None,
    default: dict[str, object],
    engines: WantedEngines,
    local: str | None,
    api_addresses: list[str],
) -> tuple[dict[str, object], WantedEngines]:
    """A node's default settings and engines, as an offline control plane (``mirror``
    set) gives them: its mirror as the node's sources, at the address the node reached
    it at (``local``), else its first advertised one; the mirror's engine digests. As
    they are otherwise."""
    if mirror is None or not api_addresses:
        return default, engines
    host, port = parse_hostport(api_addresses[0])
    base = f"http://{format_hostport(local or host, port)}"
    return offline_defaults(default, base), with_mirror_digests(engines, mirror)


def release_source(mirror: MirrorFiles | None, api_addresses: list[str], configured: str) -> str:
    """Where new machines and ``ctl upgrade`` fetch llmgw releases from: the control
    plane's mirror when the cluster is offline, else ``releases.source``."""
    if mirror is not None and api_addresses:
        return mirror_urls(f"http://{api_addresses[0]}")["llmgw_source"]
    return configured


# --- mirrors beyond the control plane (mirror.api, mirror.peers) -------------------------

PROBE_EVERY = 15.0
PROBE_TIMEOUT = 5.0


@dataclass
class MirrorState:
    """One mirror as the last probe found it."""

    url: str
    role: Literal["api", "peer"]
    live: bool | None = None  # None: not asked yet
    checked_at: float | None = None
    error: str | None = None
    # What its index lists of models: (repo lower-cased, path in it) -> sha256.
    holds: dict[tuple[str, str], str] = field(default_factory=dict)
    files: int = 0


class MirrorWatch:
    """Asks each mirror of ``mirror.api`` and ``mirror.peers`` every 15 s whether it
    answers (``/mirror/index.json``), and names the first live one holding a source's
    files for a shard to be sent from."""

    def __init__(
        self,
        config: MirrorConfig,
        own: MirrorFiles | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``own``: the control plane's mirror (``offline.mirror``), whose sha256 of a
        source's files the others must match."""
        self.own = own
        self.states = ([MirrorState(config.api, "api")] if config.api else []) + [
            MirrorState(url, "peer") for url in config.peers
        ]
        self._clock = clock

    async def probe_once(self, http: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self._probe(http, s) for s in self.states))

    async def _probe(self, http: aiohttp.ClientSession, state: MirrorState) -> None:
        url = state.url.rstrip("/") + PREFIX + INDEX
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                async with http.get(url) as resp:
                    if resp.status != 200:
                        raise BundleError(f"{url} answered HTTP {resp.status}")
                    index = parse_manifest(await resp.read(), url)
        except (BundleError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            if state.live is not False:
                log.warning("mirror %s does not answer: %s", state.url, exc or "timed out")
            state.live, state.error = False, str(exc) or "timed out"
        else:
            if state.live is not True:
                log.info("mirror %s answers (%d files)", state.url, len(index.files))
            state.live, state.error = True, None
            state.files = len(index.files)
            state.holds = {
                (str(f.repo).lower(), str(f.repo_path)): f.sha256
                for f in index.files
                if f.kind == "model"
            }
        state.checked_at = self._clock()

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=PROBE_TIMEOUT)
        if not self.states:
            return
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not stop.is_set():
                await self.probe_once(http)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PROBE_EVERY):
                        await stop.wait()

    def vouched(self, source: str) -> dict[str, str]:
        """The sha256 of ``source``'s files the control plane vouches for: its mirror's."""
        return self.own.digests_of(source) if self.own is not None else {}

    def hub_for(self, source: str) -> str | None:
        """The hub endpoint of the first live mirror that holds ``source``'s files: each
        the control plane vouches for, with that sha256 (with none vouched, any of the
        repository's). None: no live mirror holds them (the agent's own hub serves)."""
        try:
            parsed = parse_source(source)
        except SourceError:
            return None
        if parsed.kind != "hf" or parsed.repo is None:
            return None
        repo = parsed.repo.lower()
        vouched = self.vouched(source)
        for state in self.states:
            if not state.live:
                continue
            if vouched:
                held = all(state.holds.get((repo, p)) == sha for p, sha in vouched.items())
            else:
                held = any(r == repo for r, _ in state.holds)
            if held:
                return mirror_urls(state.url)["hf_endpoint"]
        return None
