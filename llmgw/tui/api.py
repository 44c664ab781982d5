"""The console's view of the admin API: the synchronous client run off the UI's loop,
and one snapshot of everything the screens show, fetched together."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from llmgw.client.admin import AdminClient, AdminError


@dataclass
class Snapshot:
    """What the control plane said at ``at``; ``error`` when it could not be reached."""

    at: float = 0.0
    status: dict[str, Any] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[dict[str, Any]] = field(default_factory=list)
    keys: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


class ConsoleApi:
    def __init__(self, client: AdminClient) -> None:
        self.client = client

    @property
    def base_url(self) -> str:
        return self.client.base_url

    async def get(self, path: str) -> Any:
        return await asyncio.to_thread(self.client.get, path)

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return await asyncio.to_thread(self.client.post, path, body or {})

    async def delete(self, path: str) -> Any:
        return await asyncio.to_thread(self.client.request, "DELETE", path)

    async def snapshot(self) -> Snapshot:
        paths = (
            "/api/v1/status",
            "/api/v1/nodes",
            "/api/v1/models",
            "/api/v1/replicas",
            "/api/v1/keys",
        )
        try:
            status, nodes, models, replicas, keys = await asyncio.gather(
                *(self.get(p) for p in paths)
            )
        except AdminError as exc:
            return Snapshot(at=time.time(), error=str(exc))
        return Snapshot(time.time(), status, nodes, models, replicas, keys)
