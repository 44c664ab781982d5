"""The control plane's part of the offline mirror (``offline.mirror``): its files are
``offline/mirrorfiles.py``'s, served at ``/mirror/`` on its listener; here is what the
agents are given of it (their llama.cpp release source and hub, the mirror's engine
digests over the stream) and how the control plane reaches itself."""

from __future__ import annotations

from dataclasses import replace

from llmgw.config import format_hostport, parse_hostport
from llmgw.offline.mirrorfiles import ENGINES, MirrorFiles, mirror_urls
from llmgw.wire.messages import WantedEngines


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
