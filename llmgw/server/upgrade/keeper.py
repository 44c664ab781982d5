"""The leader's duty that drives an upgrade run (``service.py``) a step at a time, from
the stored run alone: a leader started again on the new version, or another that took
over, reads the run and carries it on where it stands.

``upgrade_parts`` builds the service and its keeper for ``server/app.py``, with the
control planes as the run sees them (``LinkedPlanes``: the leadership's list of control
planes, what each last said over the link, and ``POST /peer/upgrade``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.ha.leadership import Leadership
from llmgw.server.leader import Duty
from llmgw.server.store import Store
from llmgw.server.upgrade.service import UpgradeService

log = logging.getLogger("llmgw.upgrade")

INTERVAL = 1.0
# A standby fetches and checks the release before it answers /peer/upgrade.
PEER_TIMEOUT = 660.0


class LinkedPlanes:
    """The control planes of the cluster over the leadership (built after this)."""

    def __init__(self, ha: Callable[[], Leadership]) -> None:
        self._ha = ha

    @property
    def name(self) -> str:
        return self._ha().name

    def others(self) -> list[str]:
        ha = self._ha()
        return sorted(
            s.name for s in ha.servers.values() if s.name != ha.name and s.removed_at is None
        )

    def version_of(self, name: str) -> str | None:
        seen = self._ha().seen.get(name)
        version = seen[1].get("version") if seen else None
        return version if isinstance(version, str) else None

    async def upgrade(self, name: str, version: str, source: str) -> None:
        ha = self._ha()
        server = ha.servers.get(name)
        if server is None:
            raise LookupError(f"no control plane {name}")
        await ha.client.json(
            "POST",
            server.peer_address,
            "/peer/upgrade",
            {"version": version, "source": source},
            timeout=PEER_TIMEOUT,
        )


class UpgradeKeeper:
    def __init__(self, service: UpgradeService, interval: float = INTERVAL) -> None:
        self.service = service
        self.interval = interval
        self.wake = asyncio.Event()
        self.passes = 0

    def poke(self) -> None:
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        await self.service.load()
        while not stop.is_set():
            try:
                await self.service.advance()
            except Exception:
                log.exception("a pass of the upgrade failed; the next one tries again")
            self.passes += 1
            # asyncio.timeout, not wait_for: a cancel (the leader stepping down) that
            # comes as the event is set must not be lost (3.11).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self.wake.wait()
            self.wake.clear()


@dataclass(frozen=True)
class UpgradeParts:
    service: UpgradeService
    keeper: UpgradeKeeper

    def duty(self) -> Duty:
        return Duty("upgrade", self.keeper.run)


def upgrade_parts(
    store: Store,
    registry: NodeRegistry,
    ha: Callable[[], Leadership],
    relaunch: Callable[[str], None],
    default_source: Callable[[], str],
) -> UpgradeParts:
    """The service and its keeper; ``default_source``: where releases come from when the
    run names none (``releases.source``, or the control plane's mirror when offline)."""
    poke: list[Callable[[], None]] = []
    service = UpgradeService(
        store, registry, LinkedPlanes(ha), relaunch, default_source, lambda: poke[0]()
    )
    keeper = UpgradeKeeper(service)
    poke.append(keeper.poke)
    return UpgradeParts(service, keeper)
