"""Signing out of the admin pages on every control plane of the cluster at once.

A session is a signed cookie that every control plane honours (``sessions.py``), so
ending it on the one that answered the sign-out is not enough: the same cookie would
still open pages on a standby until it expired. So a sign-out is kept in the store's
``session_revocations`` (the session's id and when it would have ended) and every
control plane refuses the ids it holds:

- the leader writes the row, with its audit entry; a standby cannot write the store, so
  it sends the sign-out to the leader over the control planes' link (``/peer/signout``),
  as it does its usage;
- each control plane reads the list back when its store changes: a SQLite standby as
  the leader's changes reach it (a long poll, so within a round trip), a PostgreSQL
  one every second (``Follower``), and every control plane when it starts. A signed-out
  cookie is refused everywhere well within 2 s (``tests/e2e/test_sessions_ha.py``).

The session ends on the control plane that answered at once, before the store or the
leader has answered; when neither can be reached, the sign-out holds there (and the
browser's cookie is deleted), and the log says the others did not hear of it.

Rows go once their session would have ended (each sign-out removes those): the list
holds at most the sessions signed out within a session's lifetime, 12 hours.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from llmgw.server.sessions import Session, Sessions
from llmgw.server.store import Audit, Store, StoreError

log = logging.getLogger("llmgw.pages")


@dataclass(frozen=True)
class SignOut:
    """A session ended before its time: its id, when it would have ended, and who (for
    the audit trail)."""

    sid: str
    expires: float
    actor: str


class Revocations:
    """Ends sessions on every control plane, through the store."""

    def __init__(
        self,
        sessions: Sessions,
        store: Store,
        leading: Callable[[], bool],
        to_leader: Callable[[SignOut], Awaitable[None]],
    ) -> None:
        self.sessions = sessions
        self.store = store
        self._leading = leading
        # A standby's way to the leader; raises ConnectionError when it cannot be told.
        self._to_leader = to_leader

    async def end(self, session: Session, actor: str) -> None:
        """Sign out: refused here now, and on every control plane once the store has it."""
        self.sessions.end(session)
        signed_out = SignOut(session.sid, session.expires, actor)
        try:
            if self._leading():
                await self.record(signed_out)
            else:
                await self._to_leader(signed_out)
        except (StoreError, ConnectionError) as exc:
            log.warning(
                "%s signed out here, but the other control planes were not told (%s): the "
                "session stays open there until it ends, within 12 hours",
                actor,
                exc,
            )

    async def record(self, signed_out: SignOut) -> None:
        """The leader: keep a sign-out (its own or a standby's) in the store."""
        now = time.time()
        self.sessions.ended({signed_out.sid: signed_out.expires}, now)
        audit = Audit(signed_out.actor, "admin.sign_out", "/admin")
        await self.store.revoke_session(signed_out.sid, signed_out.expires, now, audit)

    async def load(self) -> None:
        """Refuse every session the store says was signed out."""
        now = time.time()
        self.sessions.ended(await self.store.revoked_sessions(now), now)
