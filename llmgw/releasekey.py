"""The Ed25519 public keys llmgw's releases are signed with (base64 of the 32 raw bytes).

A release's ``SHA256SUMS`` is signed with the key kept by whoever cuts releases, outside
this tree (``make release SIGNING_KEY=FILE``); every llmgw trusts only the keys named
here, so a release source (GitHub, a mirror, a bundle) cannot hand a node a file of its
own. A new key is added here one release before the old one stops signing.

This file is its own module so a test can build a zipapp that trusts the test's key
(``tests/support/releases.py`` rewrites it inside the zipapp, with the version).
"""

from __future__ import annotations

PUBLIC_KEYS: tuple[str, ...] = ("xRKBmEOGGkuuqGmbGk75pl/xRlqx5V04vmfyz24saTg=",)
