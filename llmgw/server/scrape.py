"""``/metrics``: the whole Prometheus exposition of a control plane, put together from
the gateway's and the engines' families (the gateway writes those), then the fleet's
(nodes, cards, shards), the models' replicas, the keys' budgets, the fabrics and the
nodes lent to Slurm.

The fleet's part is written in a worker thread: thousands of cards make megabytes of
text, and the agents' streams (and their PINGs) are served meanwhile.
"""

from __future__ import annotations

import asyncio

from llmgw.server.catalog.service import ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet import exposition
from llmgw.server.fleet.fabrics import FabricWatch, fabric_metrics
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.gateway import Gateway
from llmgw.server.slurm.service import SlurmService


class Scrape:
    def __init__(
        self,
        gateway: Gateway,
        models: ModelService,
        views: ModelViews,
        registry: NodeRegistry,
        fabric_watch: FabricWatch,
        slurm: SlurmService | None = None,
    ) -> None:
        self.gateway = gateway
        self.models = models
        self.views = views
        self.registry = registry
        self.fabric_watch = fabric_watch
        self.slurm = slurm

    async def text(self) -> str:
        """The exposition, every family once."""
        gateway = await self.gateway.metrics_text()
        models = []
        for name, model in self.models.models.items():
            if not model.external:
                shown = self.views.model_json(model)
                models.append((name, int(shown["desired"]), int(shown["ready"])))
        keys = self.gateway.keys
        budgets = [
            (r.id, r.name, keys.usage.month.get(r.id, 0), r.budget)
            for r in keys.records()
            if r.budget is not None and r.revoked_at is None
        ]
        joules = self.registry.energy.joules_per_token(self.gateway.metrics.replica_tokens)
        snapshots = [exposition.NodeSnapshot.of(v) for v in self.registry.nodes.values()]
        found = self.fabric_watch.fabrics(self.registry.nodes.values())
        slurm = self.slurm.metrics() if self.slurm is not None else []

        def fleet() -> str:
            lines = [
                *exposition.fleet_metrics(snapshots),
                *exposition.cluster_metrics(models, budgets, joules),
                *fabric_metrics(found),
                *slurm,
            ]
            return "\n".join(lines)

        return gateway.rstrip("\n") + "\n" + await asyncio.to_thread(fleet) + "\n"
