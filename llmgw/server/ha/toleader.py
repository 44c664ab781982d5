"""What every control plane writes that only the leader's store takes: the gateway's
usage counts, the audit entries of tool calls and guard decisions, and admin page
sign-outs. The leader writes them to its store; a standby, whose store is a copy, sends
them to the leader over the control planes' link (``/peer/usage``, ``/peer/audit``,
``/peer/signout``). A standby that knows no leader, or whose leader does not take them,
raises ``ConnectionError``: the caller keeps what it had and tries again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llmgw.server.audittrail import entry_json
from llmgw.server.gateway.limits import UsageRows
from llmgw.server.ha.peerlink import PeerError
from llmgw.server.sessions import SignOut
from llmgw.server.store import Audit, Store

if TYPE_CHECKING:
    from llmgw.server.ha.leadership import Leadership


class ToLeader:
    def __init__(self, store: Store, ha: Callable[[], Leadership]) -> None:
        """``ha``: who leads, read at each write (it is made after what writes)."""
        self.store = store
        self.ha = ha

    def _leader(self, what: str) -> str:
        leader = self.ha().follower.leader
        if not leader:
            raise ConnectionError(f"a standby that knows no leader keeps its {what}")
        return leader

    async def usage(self, rows: UsageRows) -> None:
        if self.ha().leading:
            await self.store.add_usage(rows)
            return
        leader = self._leader("usage")
        await self.ha().client.json("POST", leader, "/peer/usage", [list(r) for r in rows])

    async def audit(self, entries: list[Audit]) -> None:
        if self.ha().leading:
            await self.store.audit_many(entries)
            return
        leader = self._leader("audit entries")
        body = [entry_json(e) for e in entries]
        try:
            await self.ha().client.json("POST", leader, "/peer/audit", body)
        except PeerError as exc:
            raise ConnectionError(f"the leader at {leader} did not take them: {exc}") from exc

    async def sign_out(self, signed_out: SignOut) -> None:
        leader = self._leader("sign-outs")
        body = {"sid": signed_out.sid, "expires": signed_out.expires, "actor": signed_out.actor}
        try:
            # Short: the user waits for the sign-out page, which ends the session here anyway.
            await self.ha().client.json("POST", leader, "/peer/signout", body, timeout=5)
        except PeerError as exc:
            raise ConnectionError(f"the leader at {leader} did not take it: {exc}") from exc
