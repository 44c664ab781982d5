"""Mirrors beyond the control plane (mirror.api, mirror.peers) as the control plane asks
them: one that does not answer is passed over, a shard is sent from the first live one
holding its files with the sha256 the control plane vouches for, and from none when no
live mirror holds them so."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import aiohttp

from llmgw.config import MirrorConfig
from llmgw.offline.manifest import INDEX, dump_manifest
from llmgw.offline.mirrorfiles import MirrorFiles, mirror_urls
from llmgw.server.mirror import MirrorWatch
from tests.support.bundles import GGUF
from tests.support.ports import free_port

SOURCE = f"hf:org/tiny-GGUF:{GGUF}"


async def test_a_shard_goes_to_the_first_live_mirror_holding_its_files(
    mirror: MirrorFiles, base: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    watch = MirrorWatch(MirrorConfig(api=dead, peers=[base]), own=mirror, clock=lambda: 42.0)
    assert watch.hub_for(SOURCE) is None  # not asked yet: none is known to answer
    async with aiohttp.ClientSession() as http:
        await watch.probe_once(http)
    api, peer = watch.states
    assert (api.role, api.live, api.checked_at) == ("api", False, 42.0) and api.error
    assert (peer.role, peer.live, peer.error) == ("peer", True, None)
    assert peer.files == len(mirror.held().files)
    assert watch.hub_for(SOURCE) == mirror_urls(base)["hf_endpoint"]
    assert watch.hub_for("hf:org/not-held:x.gguf") is None
    assert watch.hub_for("/models/local.gguf") is None


async def test_a_mirror_holding_other_bytes_is_not_named(
    mirror: MirrorFiles, base: str, tmp_path: Path
) -> None:
    # The control plane vouches for other bytes of the GGUF than the peer holds.
    own = tmp_path / "own"
    shutil.copytree(mirror.root, own)
    index = mirror.index()
    assert index is not None
    files = [
        dataclasses.replace(f, sha256="c" * 64) if f.repo_path == GGUF else f for f in index.files
    ]
    (own / INDEX).write_bytes(dump_manifest(dataclasses.replace(index, files=files)))
    watch = MirrorWatch(MirrorConfig(peers=[base]), own=MirrorFiles(own))
    async with aiohttp.ClientSession() as http:
        await watch.probe_once(http)
    assert watch.states[0].live
    assert watch.hub_for(SOURCE) is None
    assert watch.hub_for("hf:org/tiny-st") == mirror_urls(base)["hf_endpoint"]
