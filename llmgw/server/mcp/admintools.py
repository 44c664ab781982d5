"""``llmgw:admin``: the tool server every control plane answers in its own process.

Read-only tools over the services the admin API already uses, so an agent sees what
``llmgw ctl status``, ``ctl nodes``, ``ctl models``, ``ctl replicas``, ``ctl explain``
and ``ctl logs`` (once, never followed) show an operator:

- ``cluster_status``: this control plane (leader or not, serving or stopped, the store
  writable), nodes Ready of all, models by state, replicas Ready of all;
- ``list_nodes``: each node's state, cards, memory, labels and the replicas it serves;
- ``list_models``: each model's state and replicas (desired, Ready);
- ``list_replicas``: each replica's model, node and state (no engine ports: the engines
  are reached through the gateway, never directly);
- ``explain_placement``: every node's verdict for each profile of a model;
- ``node_logs``: the last lines of a node's agent log or of one of its replicas.

Every answer is one text block holding the JSON of the answer (what a client that
reads only text gets) and the same object as ``structuredContent``. Arguments are
checked against each tool's own input schema before anything is read; a wrong one is
an answer with ``isError`` naming the argument and what it takes, as is a refusal of
the service asked (no such node, node not connected).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Literal, NotRequired, TypedDict

from llmgw.jsonvalue import JSON, JSONObject
from llmgw.server.catalog.service import ModelService
from llmgw.server.catalog.views import ModelViews
from llmgw.server.fleet.service import FleetService
from llmgw.server.mcp.tools import ADMIN_SERVER, Tool, ToolResult
from llmgw.server.refusal import Refusal
from llmgw.server.requests import NODE_ID, REPLICA_ID, LogsQuery
from llmgw.wire.admin import ExplainJson, VerdictJson
from llmgw.wire.states import NodeState, ShardState

# node_logs: at most this many lines (ctl logs takes 2,000; an agent's prompt less),
# each cut to this many characters, so one answer stays well under the gateway's
# MAX_RESULT.
MAX_LOG_LINES = 500
MAX_LINE_CHARS = 2000
# explain_placement: the verdicts shown per profile, those that fit first.
MAX_VERDICTS = 200


class PlaneJson(TypedDict):
    """This control plane as ``cluster_status`` shows it (from ``ControlPlane``)."""

    version: str
    name: str
    leader: bool
    serving: Literal["serving", "stopped"]
    store_writable: bool
    store_problem: str | None


def plane_of(status: Mapping[str, object]) -> PlaneJson:
    """This control plane as ``GET /api/v1/status`` (``ctl status``) shows it, the part
    ``cluster_status`` repeats: one reading for both."""
    problem = status.get("store_problem")
    return {
        "version": str(status.get("version", "")),
        "name": str(status.get("name", "")),
        "leader": status.get("leader") is True,
        "serving": "stopped" if status.get("serving") == "stopped" else "serving",
        "store_writable": status.get("store_writable") is True,
        "store_problem": problem if isinstance(problem, str) else None,
    }


class Tally(TypedDict):
    total: int
    ready: int


class StatusAnswer(TypedDict):
    plane: PlaneJson
    nodes: Tally
    replicas: Tally
    # The number of models in each state (serving, degraded, starting, stopped...).
    models: dict[str, int]


class CardRow(TypedDict):
    index: int
    name: str
    memory_total: int | None
    memory_used: int | None


class ServedRow(TypedDict):
    replica: str
    model: str | None
    state: str


class NodeRow(TypedDict):
    id: str
    state: str
    reason: str
    connected: bool
    cordoned: bool
    draining: bool
    cards: list[CardRow]
    memory_total: int | None
    memory_available: int | None
    labels: dict[str, str]
    serves: list[ServedRow]


class ModelRow(TypedDict):
    name: str
    state: str
    engine: str | None
    source: str
    desired: int
    ready: int
    on_demand: bool
    context: int | None


class ReplicaRow(TypedDict):
    model: str | None
    profile: str | None
    replica: str
    node: str
    state: str
    reason: str
    engine: str | None
    stale: bool


class ExplainAnswer(TypedDict):
    model: str
    profiles: list[ExplainJson]
    # Per profile, the verdicts left out past MAX_VERDICTS (0: none).
    verdicts_left_out: dict[str, int]


class LogsAnswer(TypedDict):
    node: str
    source: str
    lines: list[str]
    cut_lines: NotRequired[int]


NO_ARGUMENTS: JSONObject = {"type": "object", "properties": {}, "additionalProperties": False}


def _schema(properties: JSONObject, required: list[JSON]) -> JSONObject:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


TOOLS: tuple[Tool, ...] = (
    Tool(
        "cluster_status",
        "The cluster at a glance: whether this control plane leads and serves, whether "
        "its store takes writes, nodes Ready of all, models by state, replicas Ready.",
        NO_ARGUMENTS,
    ),
    Tool(
        "list_nodes",
        "Every node: its state (Ready, NotReady) and why, its GPU cards with their "
        "memory in bytes, its memory, labels, cordon and drain marks, and the replicas "
        "it serves.",
        NO_ARGUMENTS,
    ),
    Tool(
        "list_models",
        "Every model of the catalog: its state (serving, degraded, starting, stopped, "
        "idle...), engine, source, replicas desired and Ready.",
        NO_ARGUMENTS,
    ),
    Tool(
        "list_replicas",
        "Every replica the nodes report: its model, profile, node, state (ready, "
        "starting, failed...) and why, and whether it is stale.",
        _schema(
            {
                "model": {
                    "type": "string",
                    "maxLength": 256,
                    "description": "only this model's replicas",
                }
            },
            [],
        ),
    ),
    Tool(
        "explain_placement",
        "Why a model's replicas are placed where they are: for each profile, what a "
        "replica asks (memory, cards, disk) and every node's verdict (fits, rank, or the "
        "reasons it does not).",
        _schema(
            {"model": {"type": "string", "maxLength": 256, "description": "a model's name"}},
            ["model"],
        ),
    ),
    Tool(
        "node_logs",
        "The last lines of a node's agent log, or of one replica's engine on it (read "
        f"once, at most {MAX_LOG_LINES} lines).",
        _schema(
            {
                "node": {
                    "type": "string",
                    "pattern": f"^{NODE_ID.pattern}$",
                    "description": "a node id (see list_nodes)",
                },
                "replica": {
                    "type": "string",
                    "pattern": f"^{REPLICA_ID.pattern}$",
                    "description": "a replica id on that node (see list_replicas); "
                    "without it, the agent's own log",
                },
                "lines": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LOG_LINES,
                    "default": 100,
                    "description": "how many of the last lines",
                },
            },
            ["node"],
        ),
    ),
)


class BadArguments(Exception):
    """A call's arguments do not fit its tool's input schema: the message says how."""


def checked(tool: Tool, arguments: Mapping[str, JSON]) -> None:
    """Raise ``BadArguments`` unless ``arguments`` fit ``tool.input_schema``: the subset
    of JSON Schema our own tools use (object of string and integer properties, required,
    no others, maxLength, pattern, minimum, maximum)."""
    schema = tool.input_schema
    assert isinstance(schema, dict)
    properties = schema.get("properties")
    assert isinstance(properties, dict)
    required = schema.get("required", [])
    assert isinstance(required, list)
    takes = ", ".join(properties) or "none"
    for name in arguments:
        if name not in properties:
            raise BadArguments(f"{tool.name} takes no argument {name!r} (it takes: {takes})")
    for needed in required:
        if needed not in arguments:
            raise BadArguments(f"{tool.name} needs the argument {needed!r}")
    for name, value in arguments.items():
        rule = properties[name]
        assert isinstance(rule, dict)
        _check_value(tool.name, name, rule, value)


def _check_value(tool: str, name: str, rule: JSONObject, value: JSON) -> None:
    what = f"{tool}'s argument {name!r}"
    if rule.get("type") == "string":
        if not isinstance(value, str):
            raise BadArguments(f"{what} is a string, not {json.dumps(value)[:40]}")
        longest = rule.get("maxLength")
        if isinstance(longest, int) and len(value) > longest:
            raise BadArguments(f"{what} is at most {longest} characters long")
        pattern = rule.get("pattern")
        if isinstance(pattern, str) and not re.fullmatch(pattern, value):
            raise BadArguments(f"{what} must match {pattern}, not {value[:80]!r}")
    elif rule.get("type") == "integer":
        # JSON's true is no number of lines, though Python counts it as one.
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadArguments(f"{what} is a whole number, not {json.dumps(value)[:40]}")
        low, high = rule.get("minimum"), rule.get("maximum")
        if isinstance(low, int) and value < low or isinstance(high, int) and value > high:
            raise BadArguments(f"{what} is from {low} to {high}, not {value}")


def answer(structured: Mapping[str, object]) -> ToolResult:
    """One answer: its JSON as text (for a client that reads text only) and as
    structured content (the same object, as plain JSON)."""
    text = json.dumps(structured, separators=(",", ":"), ensure_ascii=False)
    return ToolResult([{"type": "text", "text": text}], structured=json.loads(text))


def refused(message: str) -> ToolResult:
    return ToolResult([{"type": "text", "text": message}], is_error=True)


class AdminTools:
    """``llmgw:admin`` (a ``tools.BuiltinServer``): read-only, over the fleet, the
    catalog's views and its placement, and ``plane`` (this control plane's own state,
    read at each call)."""

    def __init__(
        self,
        fleet: FleetService,
        views: ModelViews,
        models: ModelService,
        plane: Callable[[], PlaneJson],
    ) -> None:
        self.fleet = fleet
        self.views = views
        self.models = models
        self.plane = plane
        self._tools = {t.name: t for t in TOOLS}

    @property
    def name(self) -> str:
        return ADMIN_SERVER

    def tools(self) -> list[Tool]:
        return list(TOOLS)

    async def call(self, tool: str, arguments: Mapping[str, JSON]) -> ToolResult:
        found = self._tools.get(tool)
        if found is None:
            names = ", ".join(self._tools)
            return refused(f"{ADMIN_SERVER} has no tool {tool[:80]!r}; its tools: {names}")
        try:
            checked(found, arguments)
            if tool == "node_logs":
                return answer(await self.node_logs(arguments))
            return answer(self._read(tool, arguments))
        except BadArguments as exc:
            return refused(str(exc))
        except Refusal as exc:
            return refused(exc.message)

    def _read(self, tool: str, arguments: Mapping[str, JSON]) -> Mapping[str, object]:
        if tool == "cluster_status":
            return self.cluster_status()
        if tool == "list_nodes":
            return {"nodes": self.list_nodes()}
        if tool == "list_models":
            return {"models": self.list_models()}
        if tool == "list_replicas":
            model = arguments.get("model")
            return {"replicas": self.list_replicas(model if isinstance(model, str) else None)}
        assert tool == "explain_placement"
        model = arguments["model"]
        assert isinstance(model, str)
        return self.explain_placement(model)

    # ------------------------------------------------------------------ the tools

    def cluster_status(self) -> StatusAnswer:
        nodes = self.fleet.nodes()
        replicas = self.views.replicas()
        return {
            "plane": self.plane(),
            "nodes": {
                "total": len(nodes),
                "ready": sum(1 for v in nodes if v.state == NodeState.READY),
            },
            "replicas": {
                "total": len(replicas),
                "ready": sum(1 for r in replicas if r["state"] == ShardState.READY),
            },
            "models": dict(sorted(Counter(m["state"] for m in self.views.catalog()).items())),
        }

    def list_nodes(self) -> list[NodeRow]:
        model_of = {r["replica_id"]: r["model"] for r in self.views.replicas()}
        rows: list[NodeRow] = []
        for view in self.fleet.nodes():
            shown = view.as_json()
            rows.append(
                {
                    "id": view.id,
                    "state": str(view.state),
                    "reason": view.reason,
                    "connected": view.session is not None,
                    "cordoned": view.cordoned,
                    "draining": view.draining,
                    "cards": [
                        {
                            "index": card["index"],
                            "name": card["name"],
                            "memory_total": card.get("memory_total"),
                            "memory_used": card.get("memory_used"),
                        }
                        for card in shown["gpus"]
                    ],
                    "memory_total": shown["memory_total"],
                    "memory_available": shown["memory_available"],
                    "labels": dict(view.labels),
                    "serves": [
                        {"replica": rid, "model": model_of.get(rid), "state": str(shard.state)}
                        for rid, shard in sorted(view.shards.items())
                    ],
                }
            )
        return rows

    def list_models(self) -> list[ModelRow]:
        return [
            {
                "name": m["name"],
                "state": m["state"],
                "engine": m["engine"],
                "source": m["source"],
                "desired": m["desired"],
                "ready": m["ready"],
                "on_demand": m["on_demand"],
                "context": m["context"],
            }
            for m in self.views.catalog()
        ]

    def list_replicas(self, model: str | None = None) -> list[ReplicaRow]:
        return [
            {
                "model": r["model"],
                "profile": r["profile"],
                "replica": r["replica_id"],
                "node": r["node"],
                "state": r["state"],
                "reason": r["reason"],
                "engine": r["engine"],
                "stale": r["stale"],
            }
            for r in self.views.replicas()
            if model is None or r["model"] == model
        ]

    def explain_placement(self, model: str) -> ExplainAnswer:
        found = self.models.served(model)
        profiles: list[ExplainJson] = []
        left_out: dict[str, int] = {}
        for profile in self.models.explain(found):
            verdicts = sorted(profile["verdicts"], key=_fit_first)
            left_out[profile["profile"]] = max(0, len(verdicts) - MAX_VERDICTS)
            profiles.append({**profile, "verdicts": verdicts[:MAX_VERDICTS]})
        return {"model": found.name, "profiles": profiles, "verdicts_left_out": left_out}

    async def node_logs(self, arguments: Mapping[str, JSON]) -> LogsAnswer:
        node, replica, lines = arguments["node"], arguments.get("replica"), arguments.get("lines")
        assert isinstance(node, str)
        source = replica if isinstance(replica, str) else "agent"
        n = lines if isinstance(lines, int) else 100
        got = await self.fleet.logs(node, LogsQuery(source=source, n=n))
        if not isinstance(got, list):
            raise Refusal(502, "bad_answer", f"node {node} answered its log with no lines")
        # The node's own last lines, as it sent them; a line past MAX_LINE_CHARS cut.
        kept = [str(line) for line in got[-n:]]
        cut = sum(1 for line in kept if len(line) > MAX_LINE_CHARS)
        shown: LogsAnswer = {
            "node": node,
            "source": source,
            "lines": [line[:MAX_LINE_CHARS] for line in kept],
        }
        if cut:
            shown["cut_lines"] = cut
        return shown


def _fit_first(verdict: VerdictJson) -> tuple[bool, int, str]:
    """Nodes that fit, best rank first; then those that do not, by node."""
    rank = verdict["rank"]
    return (not verdict["ok"], rank if rank is not None else 1 << 30, verdict["node"])
