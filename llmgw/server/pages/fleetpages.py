"""The fleet's pages: the overview, the nodes table, a node's page and its marks.

Each reads the registry and the catalog in-process; each change (serving switch, cordon,
drain, labels) is a call of the service that owns it (``ServingSwitch``,
``FleetService``), with the signed-in caller as its ``Principal``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from starlette.responses import JSONResponse, RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.fleet.figures import NodeFigures, node_warnings
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.fleet.registry import NodeRegistry
from llmgw.server.fleet.service import Mark
from llmgw.server.pages.frame import Frame, Page, PageCall, PageHandler, Services
from llmgw.server.pages.slurmpages import ShownNode
from llmgw.server.refusal import Refusal
from llmgw.server.requests import LabelsRequest, LogsQuery
from llmgw.wire.hardware import GPU, Disk
from llmgw.wire.states import NodeState
from llmgw.wire.warnings import split_fix

NODE_ACTIONS: tuple[Mark, ...] = ("cordon", "uncordon", "drain")


def _share(used: float | None, total: float | None) -> float | None:
    if used is not None and total is not None and total > 0:
        return max(0.0, min(1.0, float(used) / float(total)))
    return None


@dataclass(frozen=True)
class NodeRow:
    """One node as the table and its page show it: figures not read stay None."""

    id: str
    state: NodeState
    reason: str
    cordoned: bool
    draining: bool
    address: str | None
    version: str
    last_seen: float | None
    labels: dict[str, str]
    hostname: str | None
    os: str | None
    arch: str | None
    kernel: str | None
    cpu_model: str | None
    cpu_count: int | None
    cpu_share: float | None
    memory_total: int | None
    memory_used: int | None
    memory_share: float | None
    # None: the agent reported no disks.
    disks: tuple[Disk, ...] | None
    gpus: tuple[GPU, ...]
    # (card model, how many), by model.
    cards: list[tuple[str, int]]
    engine_names: list[str]
    # Each warning as (what, its fix).
    warning_pairs: list[tuple[str, str | None]]
    # What the table's filter looks in, lower case.
    search: str
    # Figures shown that are not live (older than 30 s, or unread lately by the agent),
    # by their field name ("gpus", "disks", ...), each with its age in whole seconds
    # (None: not known, as after a control plane restart): shown grey, with the age.
    stale: dict[str, int | None] = field(default_factory=dict)

    @property
    def card_count(self) -> int:
        return len(self.gpus)


def _card_name(gpu: GPU) -> str:
    return gpu.mig_class or gpu.name or "?"


def _stale(view: NodeView, figures: NodeFigures, now: float) -> dict[str, int | None]:
    live = view.live
    shown = {
        "cpu_percent": figures.cpu_percent,
        "memory_available": figures.memory_available,
        "disks": figures.disks,
        "gpus": figures.gpus or None,
    }
    stale: dict[str, int | None] = {}
    for name, value in shown.items():
        if value is not None and not live.is_live(name, now):
            age = live.age(name, now)
            stale[name] = None if age is None else int(age)
    return stale


def node_row(view: NodeView, now: float | None = None) -> NodeRow:
    """One node as the table shows it: figures not read stay None; those not live are
    the last ones read, marked in ``stale`` with their age."""
    facts, figures = view.facts, view.figures()
    total, available = figures.memory_total, figures.memory_available
    used = total - available if total is not None and available is not None else None
    cpu = figures.cpu_percent
    cards = Counter(_card_name(g) for g in figures.gpus)
    warnings = node_warnings(facts, view.live)
    return NodeRow(
        id=view.id,
        state=view.state,
        reason=view.reason,
        cordoned=view.cordoned,
        draining=view.draining,
        address=view.address,
        version=view.version,
        last_seen=view.last_seen,
        labels=dict(view.labels),
        hostname=facts.hostname if facts else None,
        os=facts.os if facts else None,
        arch=facts.arch if facts else None,
        kernel=facts.kernel if facts else None,
        cpu_model=facts.cpu_model if facts else None,
        cpu_count=figures.cpu_count,
        cpu_share=cpu / 100 if cpu is not None else None,
        memory_total=total,
        memory_used=used,
        memory_share=_share(used, total),
        disks=figures.disks,
        gpus=figures.gpus,
        cards=sorted(cards.items()),
        engine_names=[e.name for e in view.engines] if view.engines_probed else [],
        warning_pairs=[split_fix(w) for w in warnings],
        search=" ".join(
            [
                view.id,
                facts.hostname if facts else "",
                str(view.state),
                *(f"{k}={v}" for k, v in view.labels.items()),
                *cards,
            ]
        ).lower(),
        stale=_stale(view, figures, time.time() if now is None else now),
    )


SORTS: dict[str, Callable[[NodeRow], tuple[object, ...]]] = {
    "name": lambda r: (r.id,),
    "state": lambda r: (str(r.state), r.id),
    "cpu": lambda r: (r.cpu_share is None, -(r.cpu_share or 0.0), r.id),
    "ram": lambda r: (r.memory_share is None, -(r.memory_share or 0.0), r.id),
    "cards": lambda r: (-r.card_count, r.id),
    "warnings": lambda r: (-len(r.warning_pairs), r.id),
}


def node_rows(views: Iterable[NodeView], query: str, sort: str) -> list[NodeRow]:
    rows = [node_row(v) for v in views]
    words = query.lower().split()
    if words:
        rows = [r for r in rows if all(w in r.search for w in words)]
    return sorted(rows, key=SORTS.get(sort, SORTS["name"]))


class CardModel(TypedDict):
    """The cards of one model across the fleet: how many, their mean busy
    (``utilization.gpu``) and memory in use (shares 0..1; None where no card's figure was
    read)."""

    model: str
    count: int
    busy: float | None
    memory: float | None


class Overview(TypedDict):
    # (state, nodes), with "cordoned" counted apart.
    states: list[tuple[str, int]]
    cards: list[CardModel]
    # (node, what, its fix) of every warning.
    alerts: list[tuple[str, str, str | None]]


def overview_figures(registry: NodeRegistry) -> Overview:
    """Nodes by state, cards by model with mean busy and memory (of the figures that
    are live), and every alert."""
    states: Counter[str] = Counter()
    cards: dict[str, list[tuple[float | None, float | None]]] = {}
    alerts: list[tuple[str, str, str | None]] = []
    now = time.time()
    for node_id, view in sorted(registry.nodes.items()):
        states[str(view.state)] += 1
        if view.cordoned:
            states["cordoned"] += 1
        for g in NodeFigures.shown(view.facts, view.live, now).gpus:
            busy = g.utilization
            cards.setdefault(_card_name(g), []).append(
                (
                    float(busy) / 100 if busy is not None else None,
                    _share(g.memory_used, g.memory_total),
                )
            )
        for warning in node_warnings(view.facts, view.live):
            what, fix = split_fix(warning)
            alerts.append((node_id, what, fix))

    def mean(values: list[float | None]) -> float | None:
        read = [v for v in values if v is not None]
        return sum(read) / len(read) if read else None

    by_model: list[CardModel] = [
        {
            "model": name,
            "count": len(figures),
            "busy": mean([b for b, _ in figures]),
            "memory": mean([m for _, m in figures]),
        }
        for name, figures in sorted(cards.items())
    ]
    return {"states": sorted(states.items()), "cards": by_model, "alerts": alerts}


# The GPU map's figures: each a share from 0 to 1 of a card's mapping, or None (not read).
def _work(g: GPU) -> float | None:
    return g.sm_active if g.sm_active is not None else _busy(g)


def _busy(g: GPU) -> float | None:
    return g.utilization / 100 if g.utilization is not None else None


def _temperature(g: GPU) -> float | None:
    t = g.temperature
    if t is not None:
        return max(0.0, min(1.0, (t - 30.0) / 60.0))  # 30 to 90 C
    return None


GPU_FIGURES: dict[str, Callable[[GPU], float | None]] = {
    "work": _work,
    "busy": _busy,
    "memory": lambda g: _share(g.memory_used, g.memory_total),
    "temperature": _temperature,
    "power": lambda g: _share(g.power, g.power_limit),
}


class MapCard(TypedDict):
    index: int
    name: str
    uuid: str
    # The figure, 0..1, and its bucket 0..9 (a CSS class); None: not read.
    value: float | None
    bucket: int | None


class MapNode(TypedDict):
    node: str
    state: str
    cards: list[MapCard]


def gpu_map(views: Iterable[NodeView], by: str) -> list[MapNode]:
    """Every card, grouped by node, with its figure ``by`` as a bucket 0..9 (a CSS class)
    or None where the figure was not read or is not live."""
    figure = GPU_FIGURES[by]
    groups: list[MapNode] = []
    now = time.time()
    for view in sorted(views, key=lambda v: v.id):
        cards: list[MapCard] = []
        for g in NodeFigures.shown(view.facts, view.live, now).gpus:
            value = figure(g)
            cards.append(
                {
                    "index": g.index,
                    "name": _card_name(g),
                    "uuid": g.uuid,
                    "value": value,
                    "bucket": None if value is None else min(9, int(value * 10)),
                }
            )
        if cards:
            groups.append({"node": view.id, "state": str(view.state), "cards": cards})
    return groups


class GatewayTotals(TypedDict):
    """The gateway since this control plane started (``site.gateway_totals``)."""

    requests: int
    errors: int
    # Mean seconds to the first byte of an answer; None before any answer.
    ttft: float | None


class ShownShard(TypedDict):
    """A shard on a node's page."""

    replica: str
    source: str | None
    state: str
    port: int | None
    reason: str
    cards: list[str]


def pages(
    frame: Frame,
    services: Services,
    gateway_totals: Callable[[], GatewayTotals],
    recent: Callable[[], Mapping[str, object]],
    slurm_of: Callable[[str], ShownNode | None],
) -> list[Page]:
    """``gateway_totals`` gives the gateway's requests, errors and time to first token so
    far; ``recent`` its last hour; ``slurm_of`` a node's part and stage in Slurm's set
    (None: not in it, or Slurm is off)."""
    registry = services.registry
    fleet = services.fleet

    async def overview(call: PageCall) -> Response:
        shown = services.views.catalog()
        replicas: Counter[str] = Counter()
        for view in registry.nodes.values():
            for shard in view.shards.values():
                replicas[str(shard.state)] += 1
        template = "overview_body.html" if call.htmx else "overview.html"
        return frame.render(
            call.request,
            template,
            call.session,
            stopped=services.serving.stopped,
            models=shown,
            replicas=sorted(replicas.items()),
            gateway=gateway_totals(),
            **overview_figures(registry),
        )

    async def gateway_series(call: PageCall) -> Response:
        return JSONResponse(recent())

    async def serving(call: PageCall) -> Response:
        stop = call.form.get("stopped") == "true"
        await services.serving.set(stop, call.principal)
        return RedirectResponse("/admin", status_code=303)

    async def nodes(call: PageCall) -> Response:
        query = call.request.query_params.get("q", "")[:200]
        sort = call.request.query_params.get("sort", "name")
        rows = node_rows(registry.nodes.values(), query, sort)
        template = "nodes_table.html" if call.htmx else "nodes.html"
        return frame.render(
            call.request,
            template,
            call.session,
            rows=rows,
            q=query,
            sort=sort,
            total=len(registry.nodes),
        )

    def find(call: PageCall) -> NodeView:
        return fleet.node(str(call.params["node_id"]))

    async def node(call: PageCall) -> Response:
        view = find(call)
        row = node_row(view)
        shards: list[ShownShard] = [
            {
                "replica": r,
                "source": s.source,
                "state": str(s.state),
                "port": s.port,
                "reason": s.reason,
                "cards": list(s.cards),
            }
            for r, s in sorted(view.shards.items())
        ]
        template = "node_body.html" if call.htmx else "node.html"
        return frame.render(
            call.request,
            template,
            call.session,
            node=row,
            shards=shards,
            labels_text="\n".join(f"{k}={v}" for k, v in sorted(view.labels.items())),
            slurm_node=slurm_of(view.id),
        )

    async def history(call: PageCall) -> Response:
        view = find(call)
        return JSONResponse(fleet.history(view.id, 60))

    def marker(action: Mark) -> PageHandler:
        async def mark(call: PageCall) -> Response:
            view = await fleet.mark(str(call.params["node_id"]), action, call.principal)
            return RedirectResponse(f"/admin/nodes/{view.id}", status_code=303)

        mark.__name__ = f"node_{action}"
        return mark

    async def labels(call: PageCall) -> Response:
        view = find(call)
        wanted: dict[str, str] = {}
        for line in call.form.get("labels", "").splitlines():
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise Refusal(400, "bad_request", f"labels: {line.strip()!r} is not key=value")
            wanted[key.strip()] = value.strip()
        remove = [k for k in view.labels if k not in wanted]
        ask = schema.read(LabelsRequest, {"set": wanted, "remove": remove})
        await fleet.mark(view.id, "labels", call.principal, ask)
        return RedirectResponse(f"/admin/nodes/{view.id}", status_code=303)

    async def gpus(call: PageCall) -> Response:
        by = call.request.query_params.get("by", "work")
        if by not in GPU_FIGURES:
            by = "work"
        groups = gpu_map(registry.nodes.values(), by)
        template = "gpus_body.html" if call.htmx else "gpus.html"
        return frame.render(
            call.request, template, call.session, groups=groups, by=by, figures=GPU_FIGURES
        )

    async def log(call: PageCall) -> Response:
        view = find(call)
        source = call.request.query_params.get("source", "agent")[:128] or "agent"
        lines = await fleet.logs(view.id, LogsQuery(source=source, n=300))
        sources = ["agent", *sorted(view.shards)]
        template = "log_body.html" if call.htmx else "log.html"
        return frame.render(
            call.request,
            template,
            call.session,
            node_id=view.id,
            source=source,
            sources=sources,
            lines=lines,
        )

    return [
        Page("GET", "/admin", overview),
        Page("GET", "/admin/gpus", gpus),
        Page("GET", "/admin/nodes/{node_id}/log", log),
        Page("POST", "/admin/serving", serving, role="admin"),
        Page("GET", "/admin/gateway.json", gateway_series),
        Page("GET", "/admin/nodes", nodes),
        Page("GET", "/admin/nodes/{node_id}", node),
        Page("GET", "/admin/nodes/{node_id}/history", history),
        *(
            Page("POST", f"/admin/nodes/{{node_id}}/{a}", marker(a), role="operator")
            for a in NODE_ACTIONS
        ),
        Page("POST", "/admin/nodes/{node_id}/labels", labels, role="operator"),
    ]
