"""What a bundle is made from in tests: a signed llmgw release served from loopback
(``tests/support/releases.py``), a llama.cpp release source (``tests/support/engines``'s
``Mirror``) and a Hugging Face hub (the weights tests' ``FakeHub``), all on loopback."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from llmgw import release
from llmgw.offline.bundle import BundlePlan
from tests.support.engines import ASSET, Mirror
from tests.support.releases import ReleaseServer, publish, signing_key

VERSION = "0.9.0"
ENGINE_TAG = "b4242"
GGUF = "tiny-Q4_K_M.gguf"


def tiny_zipapp(path: Path) -> Path:
    """A zipapp as small as one can be: what a release's checks need, not a real llmgw."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("__main__.py", "print('llmgw')\n")
    path.write_bytes(b"#!/usr/bin/env python3\n" + buf.getvalue())
    return path


@dataclass
class Sources:
    """The three sources a bundle is made from, and the key its llmgw release is signed
    with (``public`` is what the importing llmgw must trust)."""

    releases: ReleaseServer
    engines: Mirror
    private: bytes
    public: str
    engine_asset: str

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.public,)


@contextmanager
def bundle_sources(
    root: Path, *, zipapp: Path | None = None, engine_members: dict[str, bytes | Path] | None = None
) -> Iterator[Sources]:
    """A signed llmgw ``VERSION`` for this platform (``zipapp``, else a tiny one) and a
    llama.cpp ``ENGINE_TAG`` release (``engine_members``, else one stand-in file)."""
    private, public = signing_key()
    root.mkdir(parents=True, exist_ok=True)
    pyz = zipapp or tiny_zipapp(root / "tiny.pyz")
    publish(root / "releases", VERSION, {release.platform_tag(): pyz}, private)
    engines = Mirror(root / "engines")
    members = engine_members or {"build/bin/llama-server": b"#!/bin/sh\necho stand-in\n"}
    engines.publish(ENGINE_TAG, members)
    try:
        with ReleaseServer(root / "releases").running() as server:
            yield Sources(
                releases=server,
                engines=engines,
                private=private,
                public=public,
                engine_asset=ASSET.format(tag=ENGINE_TAG),
            )
    finally:
        engines.close()


def plan(sources: Sources, hub: str, out: Path, **over: object) -> BundlePlan:
    """A bundle of ``sources``'s release and engine and two models of the hub at ``hub``
    (``over`` changes any part)."""
    base = BundlePlan(
        out=out,
        llmgw_version=VERSION,
        llmgw_source=sources.releases.url,
        engines={"llama.cpp": {"version": ENGINE_TAG, "sha256": {}}},
        engine_source=sources.engines.url,
        models=[f"hf:org/tiny-GGUF:{GGUF}", "hf:org/tiny-st"],
        hub_endpoint=hub,
        keys=sources.keys,
    )
    return replace(base, **over)  # type: ignore[arg-type]
