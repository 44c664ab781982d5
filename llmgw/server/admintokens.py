"""The admin token: which tokens open the admin API and pages, and rotating it.

The store keeps the admin tokens' SHA-256 only (``admin_tokens``); every control plane
holds those hashes in memory, reads them when it starts, and again whenever that table
changes under it (a standby, as the leader's changes reach it: within 2 s). The admin
pages' sessions are bound to the token they were opened with (``sessions.py``), so
they end with it.

Rotating makes a new token and, in one transaction with its audit entry, makes it the
only one: the old token stops opening anything on this control plane at once, and on
each standby as soon as it reloads; every page session opened with the old one ends
with it. The new token is answered once and never kept in clear, except that the
leader rewrites its own data dir's ``admin.token`` (0600, atomically), so ``llmgw ctl``
on its machine keeps working. Copies kept anywhere else (a standby's ``admin.token``,
an ``LLMGW_TOKEN``, a script's secret) must be replaced by hand. Only the leader
rotates: a standby cannot write the store.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path

from llmgw import pki
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.store import Audit, Store

log = logging.getLogger("llmgw.server")

ROTATE = "admin_token.rotate"


class AdminTokens:
    def __init__(
        self, store: Store, leading: Callable[[], bool], token_file: Path | None = None
    ) -> None:
        """``leading``: whether this control plane leads now; ``token_file``: the data
        dir's ``admin.token``, rewritten on a rotation (None: none to keep)."""
        self.store = store
        self._leading = leading
        self.token_file = token_file
        self._hashes: frozenset[str] = frozenset()

    async def load(self) -> None:
        """The store's tokens, again: at start and whenever ``admin_tokens`` changed."""
        self._hashes = frozenset(await self.store.admin_token_hashes())

    def hashes(self) -> Iterable[str]:
        """The hashes of the tokens that open the admin API and pages now."""
        return self._hashes

    def ok(self, token: str) -> bool:
        return pki.token_hash(token) in self._hashes

    async def rotate(self, by: Principal) -> tuple[str, Path | None]:
        """A new admin token, the only one from now on, and the file it was also written
        to (None when there is none, or it could not be written: the log says why)."""
        if not by.may("admin"):
            raise Refusal(403, "forbidden", "only an admin may rotate the admin token")
        if not self._leading():
            raise Refusal(
                409,
                "not_leader",
                "this control plane is a standby and cannot change the admin token; "
                "rotate it on the leader",
            )
        token = pki.new_admin_token()
        token_hash = pki.token_hash(token)
        # Neither the token nor its hash goes into the audit text.
        replaced = len(self._hashes)
        detail = f"replaced {replaced} token{'' if replaced == 1 else 's'}; their sessions end"
        audit = Audit(by.name, ROTATE, "admin token", detail)
        await self.store.replace_admin_tokens(f"rotated-{secrets.token_hex(6)}", token_hash, audit)
        self._hashes = frozenset({token_hash})
        log.info("%s rotated the admin token: the old one is refused from now on", by.name)
        return token, self._keep(token)

    def _keep(self, token: str) -> Path | None:
        """The new token in this machine's ``admin.token``, for ``llmgw ctl`` here."""
        if self.token_file is None:
            return None
        try:
            pki.replace_private(self.token_file, (token + "\n").encode())
        except OSError as exc:
            log.warning(
                "the admin token was rotated, but %s could not be rewritten (%s): ctl on "
                "this machine needs the new token (--token or LLMGW_TOKEN) until you write "
                "it there (mode 0600)",
                self.token_file,
                exc,
            )
            return None
        return self.token_file
