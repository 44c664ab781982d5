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
from typing import TypedDict

from llmgw.config import format_hostport, parse_hostport
from llmgw.server.catalog.service import ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet import exposition
from llmgw.server.fleet.fabrics import FabricWatch, fabric_metrics
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.nvlink import domains
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.gateway import Gateway
from llmgw.server.slurm.service import SlurmService
from llmgw.wire.states import NodeState


class TargetJson(TypedDict):
    """One entry of ``GET /api/v1/prometheus/targets``, as ``http_sd_configs`` reads it."""

    targets: list[str]
    labels: dict[str, str]


# A listener on every address: the node is reached at the address it came from.
_ANY = ("", "0.0.0.0", "::")


def metrics_address(view: NodeView) -> str | None:
    """HOST:PORT where ``view``'s agent serves its metrics (``agent.metrics_listen``, as
    its Register said it runs with), or None: it serves none, or it is not known where."""
    values = (view.settings or {}).get("values") or {}
    listen = (values.get("metrics_listen") or {}).get("value")
    if not isinstance(listen, str):
        return None
    host, port = parse_hostport(listen)
    if host in _ANY:
        if not view.address:
            return None
        host = view.address
    return format_hostport(host, port)


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

    def targets(self) -> list[TargetJson]:
        """Prometheus's ``http_sd_configs``: each node whose agent serves its metrics,
        with its fabric, NVLink domain and the models it serves (Ready replicas) as
        labels, comma-joined where there are several."""
        views = list(self.registry.nodes.values())
        fabrics: dict[str, set[str]] = {}
        for fabric in self.fabric_watch.fabrics(views)["fabrics"]:
            for node in fabric["nodes"]:
                fabrics.setdefault(node, set()).add(fabric["id"])
        nvlink: dict[str, set[str]] = {}
        for domain in domains(views)["domains"]:
            for tray in domain["trays"]:
                nvlink.setdefault(tray["node"], set()).add(domain["id"])
        model_of = {
            e.replica_id: model
            for model, endpoints in self.gateway.router.table().items()
            for e in endpoints
        }
        out: list[TargetJson] = []
        for view in sorted(views, key=lambda v: v.id):
            address = metrics_address(view)
            if address is None:
                continue
            models = {model_of[r] for r in view.shards if r in model_of}
            labels = {
                "node": view.id,
                "fabric": ",".join(sorted(fabrics.get(view.id, ()))),
                "nvlink_domain": ",".join(sorted(nvlink.get(view.id, ()))),
                "models": ",".join(sorted(models)),
            }
            out.append({"targets": [address], "labels": labels})
        return out

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
                self.node_texts.clear()
                text = exposition.up_metrics(ups)
            lines = [
                text.rstrip("\n"),
                *exposition.cluster_metrics(models, budgets, joules),
                *fabric_metrics(found),
                *slurm,
            ]
            return "\n".join(lines)

        return gateway.rstrip("\n") + "\n" + await asyncio.to_thread(fleet) + "\n"
