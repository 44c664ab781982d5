"""``/metrics``: the whole Prometheus exposition of a control plane, put together from
the gateway's and the engines' families (the gateway writes those), then the fleet's
(nodes, cards, shards: only while ``metrics.fleet_detail`` is on), the models'
replicas, the keys' budgets, the fabrics and the nodes lent to Slurm.

The fleet's part is written in a worker thread: thousands of cards make megabytes of
text, and the agents' streams (and their PINGs) are served meanwhile.
"""

from __future__ import annotations

import asyncio
import zlib
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


# Nodes read from the registry between two turns of the event loop, while a scrape
# takes its snapshot (about 250 us a node with 8 cards).
SNAPSHOT_BATCH = 250
# The size of each encoded piece of the exposition before it is compressed or sent.
PIECE = 4 << 20

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

    async def body(self, gzip: bool = False) -> list[bytes]:
        """The exposition, every family once, as encoded pieces of a few megabytes
        (gzip members' pieces when ``gzip``), in order.

        The event loop only reads the registry, a few hundred nodes at a time with the
        agents' streams served in between; everything as large as the whole text (its
        nodes' lines, the encoding, the compression) is done in a worker thread, and the
        whole is never copied into one string: at 5,000 nodes of 8 cards it is a quarter
        of a gigabyte, and a copy on the loop held the agents' PINGs past their timeout."""
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
        views = list(self.registry.nodes.values())
        detail = self.fleet_detail(len(views))
        # Without fleet detail only each node's llmgw_node_up is written: whether the
        # control plane holds it Ready is its own word, which no agent can say.
        snapshots: list[exposition.NodeSnapshot] = []
        if detail:
            for at in range(0, len(views), SNAPSHOT_BATCH):
                if at:
                    await asyncio.sleep(0)
                snapshots += [
                    exposition.NodeSnapshot.of(v) for v in views[at : at + SNAPSHOT_BATCH]
                ]
        ups = [] if detail else [(v.id, v.state == NodeState.READY) for v in views]
        found = self.fabric_watch.fabrics(views)
        slurm = self.slurm.metrics() if self.slurm is not None else []

        def fleet() -> list[bytes]:
            # Each node's text is kept from the last scrape while its figures are the
            # same objects; without fleet detail the agents serve them (docs/telemetry.md).
            if detail:
                nodes = self.node_texts.parts(snapshots)
            else:
                self.node_texts.clear()
                nodes = [exposition.up_metrics(ups)]
            tail = [*exposition.cluster_metrics(models, budgets, joules), *fabric_metrics(found)]
            pieces = [gateway.rstrip("\n") + "\n", *nodes, *(line + "\n" for line in tail)]
            pieces += [line + "\n" for line in slurm]
            return encoded(pieces, gzip)

        return await asyncio.to_thread(fleet)

    async def text(self) -> str:
        """The exposition as one string (tests, and a small fleet's callers)."""
        return b"".join(await self.body()).decode()


def encoded(pieces: list[str], gzip: bool) -> list[bytes]:
    """``pieces`` encoded ``PIECE`` characters or so at a time (as one gzip member,
    compressed at the fastest level, when ``gzip``: a scrape's text is repetitive)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31) if gzip else None
    out: list[bytes] = []
    batch: list[str] = []
    size = 0
    for at, piece in enumerate(pieces):
        batch.append(piece)
        size += len(piece)
        if size < PIECE and at + 1 < len(pieces):
            continue
        data = "".join(batch).encode()
        batch, size = [], 0
        out.append(data if packer is None else packer.compress(data))
    if packer is not None:
        out.append(packer.flush())
    return [b for b in out if b]
