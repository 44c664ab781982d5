"""The cluster's control planes as an operator sees and changes them: every one with
how it stands now (``ctl servers``, and the counts ``/api/v1/status`` gives), a new one
joining with its token (``server join``, checked by ``joining.admit``), and one removed
by name (``server remove``). Each change is written to the store (a removal audited
under the caller's name, a joining under its token's), then the leadership reads the
list again, so the certificate of one that joined opens the control planes' link at
once, and that of one removed is refused from then on."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from llmgw.server.ha.joining import Admission, admit
from llmgw.server.ha.leadership import WATCH, Leadership
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import JoinServer
from llmgw.server.store import Audit


class Membership:
    def __init__(self, ha: Leadership, admission: Callable[[], Awaitable[Admission]]) -> None:
        """``admission``: what checking a joiner needs, as it stands now (the leader,
        the term, the store's settings)."""
        self.ha = ha
        self.admission = admission

    async def join(self, ask: JoinServer) -> dict[str, object]:
        """A new control plane's joining: its token checked, its certificate signed."""
        answer = await admit(await self.admission(), ask)
        await self.ha.reload_servers()
        return answer

    async def remove(self, name: str, by: Principal) -> bool:
        """Whether ``name`` was removed now (False: it was removed before). The control
        plane answering, while it leads, cannot remove itself."""
        if name == self.ha.name:
            raise Refusal(
                409,
                "server_leads",
                f"{name} is the control plane answering, and it leads; promote another "
                "first, then remove this one from there",
            )
        known = {s.name for s in await self.ha.store.list_servers()}
        if name not in known:
            raise Refusal(404, "not_found", f"no control plane named {name!r}")
        audit = Audit(by.name, "server.remove", name)
        removed = await self.ha.store.remove_server(name, time.time(), audit)
        await self.ha.reload_servers()
        return removed

    def listing(self) -> list[dict[str, object]]:
        """``/api/v1/servers``: every control plane as this one knows it (the others'
        role, term, lag and problem as they last said them)."""
        out: list[dict[str, object]] = []
        for s in sorted(self.ha.servers.values(), key=lambda r: r.name):
            state: Mapping[str, object] | None
            if s.name == self.ha.name:
                state = self.ha.state()
                contact: float | None = self.ha.clock()
            else:
                seen = self.ha.seen.get(s.name)
                contact, state = seen if seen else (None, None)
                if contact is not None and self.ha.clock() - contact > 3 * WATCH:
                    state = None  # not answering now
            out.append(
                {
                    "name": s.name,
                    "role": state.get("role") if state else ("removed" if s.removed_at else None),
                    "term": state.get("term") if state else None,
                    "answers": state is not None,
                    "api_address": s.api_address,
                    "agent_address": s.agent_address,
                    "peer_address": s.peer_address,
                    "last_contact": contact,
                    "lag_seconds": state.get("lag_seconds") if state else None,
                    "problem": state.get("problem") if state else None,
                    # None: not answering now, or older than llmgw's versions on the link.
                    "version": state.get("version") if state else None,
                    "joined_at": s.joined_at,
                    "removed_at": s.removed_at,
                    "this": s.name == self.ha.name,
                }
            )
        return out

    def counts(self) -> dict[str, int]:
        """Control planes of the cluster, and how many answer now (this one included)."""
        listed = self.listing()
        current = [s for s in listed if s["removed_at"] is None]
        return {"total": len(current), "answering": sum(1 for s in current if s["answers"])}
