"""``/metrics``: the whole Prometheus exposition of a control plane, put together from
the gateway's and the engines' families (the gateway writes those), then the fleet's
(nodes, cards, shards: only while ``metrics.fleet_detail`` is on), the models'
replicas, the keys' budgets, the fabrics and the nodes lent to Slurm.

The fleet's part is written in a worker thread: thousands of cards make megabytes of
text, and the agents' streams (and their PINGs) are served meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmgw.server.catalog.service import ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet import exposition
from llmgw.server.fleet.fabrics import FabricWatch, fabric_metrics
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.gateway import Gateway
from llmgw.server.slurm.service import SlurmService
from llmgw.wire.states import NodeState


class Scrape:
    def __init__(
        self,
        gateway: Gateway,
        models: ModelService,
        views: ModelViews,
        registry: NodeRegistry,
        fabric_watch: FabricWatch,
        slurm: SlurmService | None = None,
        fleet_detail: Callable[[int], bool] = lambda nodes: True,
    ) -> None:
        """``fleet_detail(nodes)``: whether a fleet of that many nodes has its nodes'
        and cards' families written (``metrics.fleet_detail``)."""
        self.gateway = gateway
        self.models = models
        self.views = views
        self.registry = registry
        self.fabric_watch = fabric_watch
        self.slurm = slurm
        self.fleet_detail = fleet_detail
        self.node_texts = exposition.NodeTexts()

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
        nodes = self.registry.nodes
        detail = self.fleet_detail(len(nodes))
        # Without fleet detail only each node's llmgw_node_up is written: whether the
        # control plane holds it Ready is its own word, which no agent can say.
        snapshots = [exposition.NodeSnapshot.of(v) for v in nodes.values()] if detail else []
        ups = [] if detail else [(v.id, v.state == NodeState.READY) for v in nodes.values()]
        found = self.fabric_watch.fabrics(self.registry.nodes.values())
        slurm = self.slurm.metrics() if self.slurm is not None else []

        def fleet() -> str:
            # Each node's text is kept from the last scrape while its figures are the
            # same objects; without fleet detail the agents serve them (docs/telemetry.md).
            if detail:
                text = self.node_texts.text(snapshots)
            else:
                text = exposition.up_metrics(ups)
            lines = [
                text.rstrip("\n"),
                *exposition.cluster_metrics(models, budgets, joules),
                *fabric_metrics(found),
                *slurm,
            ]
            return "\n".join(lines)

        return gateway.rstrip("\n") + "\n" + await asyncio.to_thread(fleet) + "\n"
