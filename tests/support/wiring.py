"""Services built for tests the way ``server/app.py`` builds them, each collaborator
handed in: hooks that do nothing where a test does not look at them, so a test says
which ones it watches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from llmgw.config import SchedulingConfig
from llmgw.modelkit.sizing import ModelShape
from llmgw.server.catalog.reconciler import Reconciler
from llmgw.server.catalog.service import CatalogHooks, ModelService
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry, RegistryHooks
from llmgw.server.fleet.wiring import Wiring
from llmgw.server.principal import Principal
from llmgw.server.store import Store

# The caller of a test that changes something, as the one gate would name it.
ADMIN = Principal("admin@test", "admin", "token")
QUIET = RegistryHooks(changed=lambda: None, kv_blocks=lambda node, msg, runs: None)


def registry(
    store: Store, interval: float = 5.0, missed: int = 3, hooks: RegistryHooks = QUIET
) -> NodeRegistry:
    return NodeRegistry(store, interval, missed, hooks)


def reconciler(
    config: SchedulingConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
    engine_version: Callable[[str], str | None] = lambda engine: None,
    wiring: Callable[[Mapping[str, NodeView]], Mapping[str, Wiring]] = lambda views: {},
) -> Reconciler:
    return Reconciler(config or SchedulingConfig(), engine_version, wiring, clock)


async def _keep_files(source: str, by: Principal) -> None:
    return None


def model_service(
    store: Store,
    nodes: NodeRegistry,
    inspect: Callable[[str, bool], Awaitable[ModelShape]],
    config: SchedulingConfig | None = None,
    engine_version: Callable[[str], str | None] = lambda engine: None,
    remove_files: Callable[[str, Principal], Awaitable[None]] = _keep_files,
) -> ModelService:
    config = config or SchedulingConfig()
    return ModelService(
        store,
        nodes,
        reconciler(config, engine_version=engine_version),
        config,
        b"secret",
        asyncio.Event(),
        CatalogHooks(inspect=inspect, remove_files=remove_files),
    )
