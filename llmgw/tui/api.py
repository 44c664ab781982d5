"""The console's view of the admin API: the synchronous client run off the UI's loop,
and one snapshot of everything the screens show, fetched together."""

from __future__ import annotations

import asyncio
import time
import urllib.error
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

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

    async def history(self, node_id: str, minutes: float = 60) -> dict[str, Any] | None:
        """A node's last ``minutes`` of figures (``GET /api/v1/nodes/{id}/history``,
        columnar, ``null`` where not read); None when the control plane answers 404, as
        one older than the history does."""
        path = f"/api/v1/nodes/{quote(node_id, safe='')}/history?minutes={minutes:g}"
        try:
            answer: dict[str, Any] = await self.get(path)
        except AdminError as exc:
            cause = exc.__cause__
            if isinstance(cause, urllib.error.HTTPError) and cause.code == 404:
                return None
            raise
        return answer

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
