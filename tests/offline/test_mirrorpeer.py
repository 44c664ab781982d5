"""A mirror on a node following another: every file fetched and checked against the
other's index, nothing fetched again once held, and a file unlike its index refused
and left unserved while the rest are kept."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from llmgw.offline.mirrorfiles import MirrorFiles
from llmgw.offline.mirrorpeer import follow_once
from tests.support.bundles import GGUF


async def test_a_peer_follows_every_file_checked_and_then_fetches_nothing(
    mirror: MirrorFiles, base: str, tmp_path: Path
) -> None:
    peer = tmp_path / "peer"
    async with aiohttp.ClientSession() as http:
        first = await follow_once(peer, base, http)
        theirs = mirror.index()
        assert theirs is not None
        assert sorted(first.fetched) == sorted(f.path for f in theirs.files)
        assert first.refused == {}
        for f in theirs.files:
            assert (peer / f.path).read_bytes() == (mirror.root / f.path).read_bytes()
        assert MirrorFiles(peer).index() == theirs
        again = await follow_once(peer, base, http)
    assert again.fetched == [] and again.refused == {}


async def test_a_file_unlike_its_index_is_refused_and_not_served(
    mirror: MirrorFiles, base: str, tmp_path: Path
) -> None:
    changed = f"hf/org/tiny-GGUF/{GGUF}"
    data = bytearray((mirror.root / changed).read_bytes())
    data[7] ^= 0xFF
    (mirror.root / changed).write_bytes(bytes(data))
    peer = tmp_path / "peer"
    async with aiohttp.ClientSession() as http:
        done = await follow_once(peer, base, http)
    assert list(done.refused) == [changed]
    assert "its index lists" in done.refused[changed]
    assert not (peer / changed).exists()
    assert not list(peer.rglob("*.part"))
    held = MirrorFiles(peer)
    assert held.file(changed) is None
    assert held.file("hf/org/tiny-st/model.safetensors") is not None
