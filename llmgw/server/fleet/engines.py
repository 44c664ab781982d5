"""The engines the fleet runs, decided by the control plane: which engines at which
versions (``engines:`` in server.yaml, with ``ctl engines set`` over it), and each node's
build choice (``ctl engine-build NODE BUILD``).

server.yaml's map is the base (this llmgw release's pin when it names none); what an
operator sets at run time is one JSON document in the store's settings (``engines``),
written with its audit entry (``engines.set``, ``engines.unset``, ``engines.build``) and
announced through ``on_change``, so connected agents hear of it at once and converge:
each installs what it lacks in the background and reports how it goes; the catalog
replaces the replicas of a changed engine one at a time.

``nodes`` reads what every node reports against what the fleet wants, a row per node and
engine, for ``ctl engines``, the console and the pages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypedDict

from llmgw.enginepins import (
    PinError,
    check_build,
    check_engine,
    parse_want,
    parse_wanted,
    pinned,
)
from llmgw.server.fleet.nodeview import NodeView
from llmgw.server.principal import Principal
from llmgw.server.refusal import Refusal
from llmgw.server.requests import EngineBuild, EngineSet
from llmgw.server.store import Store
from llmgw.wire.messages import WantedEngines

SETTING = "engines"
HISTORY_ACTIONS = ("engines.set", "engines.unset", "engines.build")


class WantedJson(TypedDict):
    """One engine the fleet names, and whether server.yaml or ``ctl engines`` set it."""

    engine: str
    version: str
    sha256: dict[str, str]
    index_url: str | None
    # The OS packages it needs, per package manager (apt, dnf); empty when none named.
    packages: dict[str, list[str]]
    source: Literal["server.yaml", "ctl"]


class EnginesDocument(TypedDict):
    version: int
    engines: list[WantedJson]
    # Each node's build choice, where it is not ``auto``.
    builds: dict[str, str]


class EngineChange(TypedDict):
    """One change, as the audit log keeps it."""

    at: float
    actor: str
    action: str
    target: str
    change: str


class FleetEngines:
    def __init__(
        self,
        store: Store,
        configured: Mapping[str, Any] | None,
        on_change: Callable[[str | None, str | None, str | None], None],
    ) -> None:
        """``on_change(engine, old, new)``: after every change, the engine whose
        version moved and its versions (None for a change of no one engine's version)."""
        self.store = store
        # server.yaml's (checked when it was read), or this release's pin.
        self.base = parse_wanted(configured) if configured is not None else pinned()
        # Set at run time, over the base: an engine's map, or None for "not managed".
        self.overrides: dict[str, dict[str, Any] | None] = {}
        self.builds: dict[str, str] = {}
        self.version = 0
        self.on_change = on_change

    async def load(self) -> None:
        raw = await self.store.get_setting(SETTING)
        doc = json.loads(raw) if raw else {}
        self.overrides = {
            str(k): (parse_want(str(k), v) if v is not None else None)
            for k, v in (doc.get("engines") or {}).items()
        }
        self.builds = {str(k): check_build(str(v)) for k, v in (doc.get("builds") or {}).items()}
        self.version = int(doc.get("version") or 0)

    @property
    def wanted(self) -> dict[str, dict[str, Any]]:
        """Every engine the fleet names, with its version, digests and index."""
        out = {k: v for k, v in self.base.items() if k not in self.overrides}
        out.update({k: v for k, v in self.overrides.items() if v is not None})
        return dict(sorted(out.items()))

    def version_of(self, engine: str) -> str | None:
        """The version the fleet runs ``engine`` at; None when it names none."""
        want = self.wanted.get(engine)
        return str(want["version"]) if want else None

    def source_of(self, engine: str) -> Literal["server.yaml", "ctl"]:
        if engine in self.overrides:
            return "ctl"
        return "server.yaml"

    def build_of(self, node_id: str) -> str:
        return self.builds.get(node_id, "auto")

    def message(self, node_id: str) -> WantedEngines:
        return WantedEngines(
            version=self.version, engines=self.wanted, build=self.build_of(node_id)
        )

    def document(self) -> EnginesDocument:
        return {
            "version": self.version,
            "engines": [
                {
                    "engine": name,
                    "version": want["version"],
                    "sha256": dict(want["sha256"]),
                    "index_url": want.get("index_url"),
                    "packages": {m: list(n) for m, n in (want.get("packages") or {}).items()},
                    "source": self.source_of(name),
                }
                for name, want in self.wanted.items()
            ],
            "builds": dict(sorted(self.builds.items())),
        }

    # --- changes ----------------------------------------------------------------------

    async def ask(self, ask: EngineSet, by: Principal) -> EnginesDocument:
        """``ctl engines set|unset``: a version (with its sha256 and package index) or
        none; a Refusal saying what is wrong when it is refused."""
        if ask.unset == (ask.version is not None):
            raise Refusal(400, "bad_request", "version: give a version, or unset, not both")
        value: dict[str, object] | None = None
        if ask.version is not None:
            value = {"version": ask.version, "sha256": dict(ask.sha256 or {})}
            if ask.index_url is not None:
                value["index_url"] = ask.index_url
            if ask.packages is not None:
                value["packages"] = {m: list(n) for m, n in ask.packages.items()}
        try:
            return await self.set(ask.engine, value, by)
        except PinError as exc:
            raise Refusal(400, "bad_request", str(exc)) from None

    async def ask_build(self, node_id: str, ask: EngineBuild, by: Principal) -> EnginesDocument:
        """``ctl engines build NODE``: which build of llama.cpp a node installs."""
        try:
            return await self.set_build(node_id, ask.build, by)
        except PinError as exc:
            raise Refusal(400, "bad_request", str(exc), "build") from None

    async def set(self, engine: str, value: object, by: Principal) -> EnginesDocument:
        """Name ``engine`` at a version (``value``: a version or a map), or with None stop
        naming it (its installs are left where they are). PinError when refused."""
        check_engine(engine)
        old = self.version_of(engine)
        want = parse_want(engine, value) if value is not None else None
        overrides = {**self.overrides, engine: want}
        if want is None:
            shown = f"{engine} not managed"
        else:
            pins = f", {len(want['sha256'])} sha256 pinned" if want["sha256"] else ""
            shown = f"{engine} {want['version']}{pins}"
        await self._write(
            overrides,
            self.builds,
            by.name,
            "engines.unset" if want is None else "engines.set",
            engine,
            shown,
        )
        self.on_change(engine, old, self.version_of(engine))
        return self.document()

    async def set_build(self, node_id: str, build: str, by: Principal) -> EnginesDocument:
        check_build(build)
        builds = {**self.builds, node_id: build}
        if build == "auto":
            builds.pop(node_id)
        await self._write(
            self.overrides, builds, by.name, "engines.build", node_id, f"{node_id}: {build}"
        )
        self.on_change(None, None, None)
        return self.document()

    async def _write(
        self,
        overrides: dict[str, dict[str, Any] | None],
        builds: dict[str, str],
        actor: str,
        action: str,
        target: str,
        detail: str,
    ) -> None:
        version = self.version + 1
        doc = {"engines": overrides, "builds": builds, "version": version}
        await self.store.put_setting(SETTING, json.dumps(doc, sort_keys=True))
        await self.store.audit(actor, action, target, detail)
        self.overrides, self.builds, self.version = overrides, builds, version

    async def history(self, limit: int = 200) -> list[EngineChange]:
        """The changes, newest first: when, who, what (``engines.set``, ``.unset``,
        ``.build``) and to what."""
        rows = await self.store.audit_log(limit=5000)
        changes: list[EngineChange] = [
            {
                "at": r["at"],
                "actor": r["actor"],
                "action": r["action"],
                "target": r["target"],
                "change": r["detail"],
            }
            for r in rows
            if r.get("action") in HISTORY_ACTIONS
        ]
        return changes[:limit]

    # --- what the nodes run -----------------------------------------------------------

    def nodes(self, views: Iterable[NodeView]) -> list[EngineRow]:
        """A row per node and engine the fleet names: what the node has against it."""
        rows: list[EngineRow] = []
        wanted = self.wanted
        for view in sorted(views, key=lambda v: v.id):
            build = self.build_of(view.id)
            for engine, want in wanted.items():
                rows.append(node_row(view, engine, str(want["version"]), build))
        return rows


EngineStanding = Literal["ready", "installing", "failed", "configured", "off", "missing", "unknown"]


class EngineRow(TypedDict):
    """One node's standing with one engine the fleet names."""

    node: str
    engine: str
    wanted: str
    versions: list[str]
    build: str
    state: EngineStanding
    # What converging on it is doing, in the node's words.
    message: str | None


def node_row(view: NodeView, engine: str, wanted: str, build: str) -> EngineRow:
    """One node's standing with one engine: ``ready`` (the wanted version is there),
    ``installing``, ``failed``, ``configured`` (named on purpose on the node, not
    managed), ``off`` (build none), ``missing``, or ``unknown`` before it reported."""
    mine = [e for e in view.engines if e.name == engine]
    versions = sorted({e.version for e in mine if e.version})
    message = view.engine_progress.get(engine)
    state: EngineStanding
    if not view.engines_probed:
        state = "unknown"
    elif any(e.origin == "configured" for e in mine):
        state = "configured"
    elif wanted in versions:
        state = "ready"
    elif build == "none":
        state = "off"
    elif message and message.startswith("installing"):
        state = "installing"
    elif message and message.startswith("install failed"):
        state = "failed"
    else:
        state = "missing"
    return {
        "node": view.id,
        "engine": engine,
        "wanted": wanted,
        "versions": versions,
        "build": build,
        "state": state,
        "message": message,
    }


__all__ = ["FleetEngines", "PinError", "node_row"]
