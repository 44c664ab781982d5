"""The fleet's pages: the overview, the nodes table, a node's page and its marks.

Each reads the registry and the catalog in-process; each change (serving switch, cordon,
drain, labels) is a call of the service that owns it (``ServingSwitch``,
``FleetService``), with the signed-in caller as its ``Principal``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from starlette.responses import JSONResponse, RedirectResponse, Response

from llmgw.server import schema
from llmgw.server.fleet.registry import NodeRegistry, NodeView
from llmgw.server.fleet.service import Mark
from llmgw.server.pages.frame import Frame, Page, PageCall, Services
from llmgw.server.refusal import Refusal
from llmgw.server.requests import LabelsRequest, LogsQuery
from llmgw.wire.warnings import split_fix

NODE_ACTIONS: tuple[Mark, ...] = ("cordon", "uncordon", "drain")


def _share(used: Any, total: Any) -> float | None:
    if isinstance(used, int | float) and isinstance(total, int | float) and total > 0:
        return max(0.0, min(1.0, float(used) / float(total)))
    return None


def node_row(view: NodeView) -> dict[str, Any]:
    """One node as the table shows it: figures not read stay None."""
    shown = view.as_json()
    total, available = shown.get("memory_total"), shown.get("memory_available")
    used = total - available if isinstance(total, int) and isinstance(available, int) else None
    cpu = shown.get("cpu_percent")
    gpus = [g for g in shown.get("gpus") or [] if isinstance(g, dict)]
    cards = Counter(str(g.get("mig_class") or g.get("name") or "?") for g in gpus)
    warnings = [split_fix(str(w)) for w in shown.get("warnings") or []]
    engines = [str(e.get("name", "?")) for e in shown.get("engines") or [] if isinstance(e, dict)]
    return {
        **shown,
        "cpu_share": cpu / 100 if isinstance(cpu, int | float) else None,
        "memory_used": used,
        "memory_share": _share(used, total),
        "cards": sorted(cards.items()),
        "card_count": len(gpus),
        "engine_names": engines,
        "warning_pairs": warnings,
        "search": " ".join(
            [
                view.id,
                str(shown.get("hostname") or ""),
                str(shown.get("state")),
                *(f"{k}={v}" for k, v in view.labels.items()),
                *cards,
            ]
        ).lower(),
    }


SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "name": lambda r: r["id"],
    "state": lambda r: (str(r["state"]), r["id"]),
    "cpu": lambda r: (r["cpu_share"] is None, -(r["cpu_share"] or 0.0), r["id"]),
    "ram": lambda r: (r["memory_share"] is None, -(r["memory_share"] or 0.0), r["id"]),
    "cards": lambda r: (-r["card_count"], r["id"]),
    "warnings": lambda r: (-len(r["warning_pairs"]), r["id"]),
}


def node_rows(views: Iterable[NodeView], query: str, sort: str) -> list[dict[str, Any]]:
    rows = [node_row(v) for v in views]
    words = query.lower().split()
    if words:
        rows = [r for r in rows if all(w in r["search"] for w in words)]
    return sorted(rows, key=SORTS.get(sort, SORTS["name"]))


def overview_figures(registry: NodeRegistry) -> dict[str, Any]:
    """Nodes by state, cards by model with mean work and memory, and every alert."""
    states: Counter[str] = Counter()
    cards: dict[str, list[tuple[float | None, float | None]]] = {}
    alerts: list[tuple[str, str, str | None]] = []
    for node_id, view in sorted(registry.nodes.items()):
        shown = view.as_json()
        states[str(shown["state"])] += 1
        if view.cordoned:
            states["cordoned"] += 1
        for g in shown.get("gpus") or []:
            if not isinstance(g, dict):
                continue
            work = g.get("utilization")
            name = str(g.get("mig_class") or g.get("name") or "?")
            cards.setdefault(name, []).append(
                (
                    float(work) / 100 if isinstance(work, int | float) else None,
                    _share(g.get("memory_used"), g.get("memory_total")),
                )
            )
        for warning in shown.get("warnings") or []:
            what, fix = split_fix(str(warning))
            alerts.append((node_id, what, fix))

    def mean(values: list[float | None]) -> float | None:
        read = [v for v in values if v is not None]
        return sum(read) / len(read) if read else None

    by_model = [
        {
            "model": name,
            "count": len(figures),
            "work": mean([w for w, _ in figures]),
            "memory": mean([m for _, m in figures]),
        }
        for name, figures in sorted(cards.items())
    ]
    return {"states": sorted(states.items()), "cards": by_model, "alerts": alerts}


# The GPU map's figures: each a share from 0 to 1 of a card's mapping, or None (not read).
def _work(g: dict[str, Any]) -> float | None:
    sm = g.get("sm_active")
    if isinstance(sm, int | float) and not isinstance(sm, bool):
        return float(sm)
    return _busy(g)


def _busy(g: dict[str, Any]) -> float | None:
    u = g.get("utilization")
    return float(u) / 100 if isinstance(u, int | float) and not isinstance(u, bool) else None


def _temperature(g: dict[str, Any]) -> float | None:
    t = g.get("temperature")
    if isinstance(t, int | float) and not isinstance(t, bool):
        return max(0.0, min(1.0, (float(t) - 30.0) / 60.0))  # 30 to 90 C
    return None


GPU_FIGURES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "work": _work,
    "busy": _busy,
    "memory": lambda g: _share(g.get("memory_used"), g.get("memory_total")),
    "temperature": _temperature,
    "power": lambda g: _share(g.get("power"), g.get("power_limit")),
}


def gpu_map(views: Iterable[NodeView], by: str) -> list[dict[str, Any]]:
    """Every card, grouped by node, with its figure ``by`` as a bucket 0..9 (a CSS class)
    or None where the figure was not read."""
    figure = GPU_FIGURES[by]
    groups = []
    for view in sorted(views, key=lambda v: v.id):
        shown = {**view.facts, **view.live}
        cards = []
        for g in shown.get("gpus") or []:
            if not isinstance(g, dict):
                continue
            value = figure(g)
            cards.append(
                {
                    "index": g.get("index"),
                    "name": g.get("mig_class") or g.get("name") or "?",
                    "uuid": g.get("uuid") or "",
                    "value": value,
                    "bucket": None if value is None else min(9, int(value * 10)),
                }
            )
        if cards:
            groups.append({"node": view.id, "state": str(view.state), "cards": cards})
    return groups


def pages(
    frame: Frame,
    services: Services,
    gateway_totals: Callable[[], dict[str, Any]],
    recent: Callable[[], dict[str, Any]],
) -> list[Page]:
    """``gateway_totals`` gives the gateway's requests, errors and time to first token so
    far; ``recent`` its last hour."""
    registry = services.registry
    fleet = services.fleet

    async def overview(call: PageCall) -> Response:
        shown = services.views.catalog()
        replicas: Counter[str] = Counter()
        for view in registry.nodes.values():
            for shard in view.shards.values():
                replicas[str(shard.state)] += 1
        context = {
            "stopped": services.serving.stopped,
            "models": shown,
            "replicas": sorted(replicas.items()),
            "gateway": gateway_totals(),
            **overview_figures(registry),
        }
        template = "overview_body.html" if call.htmx else "overview.html"
        return frame.render(call.request, template, call.session, **context)

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
        context: dict[str, Any] = {
            "rows": rows,
            "q": query,
            "sort": sort,
            "total": len(registry.nodes),
        }
        template = "nodes_table.html" if call.htmx else "nodes.html"
        return frame.render(call.request, template, call.session, **context)

    def find(call: PageCall) -> NodeView:
        return fleet.node(str(call.params["node_id"]))

    async def node(call: PageCall) -> Response:
        view = find(call)
        row = node_row(view)
        shards = [
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
        context: dict[str, Any] = {
            "node": row,
            "shards": shards,
            "labels_text": "\n".join(f"{k}={v}" for k, v in sorted(view.labels.items())),
        }
        template = "node_body.html" if call.htmx else "node.html"
        return frame.render(call.request, template, call.session, **context)

    async def history(call: PageCall) -> Response:
        view = find(call)
        return JSONResponse(fleet.history(view.id, 60))

    def marker(action: Mark) -> Callable[[PageCall], Any]:
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
