"""Models: replicas per profile, context, longest answer, and what can be done to them:
serve (a form with the planner's estimate), stop, start, restart, context, cards,
replicas per profile and remove."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.coordinate import Coordinate
from textual.timer import Timer
from textual.widgets import Button, DataTable, Input, Static

from llmgw.client.adminbase import AdminError
from llmgw.client.ctl_models import NO_STATUS
from llmgw.tui.api import ConsoleApi, Snapshot
from llmgw.tui.base import DASH, Pane, fill, gib
from llmgw.tui.dialogs import ConfirmDialog, Field, FormDialog, Values
from llmgw.wire.admin import ModelJson, ModelRemovedJson, PlanJson, ProfileJson

COLUMNS = (
    "MODEL",
    "STATE",
    "READY",
    "ENGINE",
    "CONTEXT",
    "MAX OUTPUT",
    "PROFILES",
    "CPU SPEED",
    "NOTE",
)
# The serve form's fields the planner takes; a change of any asks it again.
PLANNED = ("source", "engine", "context", "gpus", "cpu_cores")
PLAN_DELAY = 0.6

SERVE_FIELDS = (
    Field("source", "Source", required=True, placeholder="hf:ORG/REPO[:QUANT], https://… or /path"),
    Field("name", "Name", placeholder="default: from the source"),
    Field("engine", "Engine", placeholder="llama.cpp, vllm, sglang, freetoken, tensorrt-llm"),
    Field("replicas", "Replicas", "int", 1),
    Field("context", "Context", "int", placeholder="tokens per request (default: trained, cut)"),
    Field("gpus", "GPUs per replica", "int", placeholder="0: on the CPU"),
    Field("cpu_cores", "CPU cores", "float", placeholder="cores reserved per replica"),
    Field("memory", "Memory", "size", placeholder="per replica, like 8GiB (default: estimated)"),
    Field("on_demand", "On demand: start on the first request, back to zero when idle", "bool"),
)


def plan_query(values: Values) -> dict[str, str]:
    """The plan's query for the serve form's values."""
    query = {"source": str(values["source"])}
    for key in ("engine", "context", "gpus"):
        if values.get(key) is not None:
            query[key] = str(values[key])
    cores = values.get("cpu_cores")
    # The planner takes whole cores only.
    if isinstance(cores, float) and cores.is_integer():
        query["cpu_cores"] = str(int(cores))
    return query


def plan_summary(plan: PlanJson) -> str:
    """The planner's estimate as the serve form shows it: memory per replica, where it
    fits now per node, and the CPU speed."""
    memory = plan["memory"]
    shape = plan["shape"]
    lines = [
        f"{shape.get('architecture') or plan.get('format')}, "
        f"{gib(plan.get('weight_bytes'))} GiB of weights · engine {plan.get('engine')} · "
        f"context {plan.get('context')} ({plan.get('context_basis')}) x {plan.get('slots')}",
        f"Memory per replica: {gib(plan['memory_cpu']['total'])} GiB on the CPU",
    ]
    nodes = plan["nodes"]
    if plan.get("cards") or any(n["where"] == "cards" for n in nodes):
        lines[-1] += f", {gib(memory['total'])} GiB on {memory['cards'] or 1} card(s)"
    for node in nodes:
        tps = node["cpu"]["tokens_per_second"]
        speed = f", CPU ~{tps:.1f} tokens/s" if isinstance(tps, int | float) else ""
        where = node["where"]
        gpu = node["gpu"]
        if where == "cards" and gpu is not None:
            verdict = "fits on cards " + ", ".join(str(c["index"]) for c in gpu["cards"])
        elif where == "cpu":
            verdict = "fits on the CPU"
        else:
            verdict = "no: " + "; ".join(node["reasons"])
        lines.append(f"  {node['node']}: {verdict}{speed}")
    fits = plan["fits_on"]
    lines.append(f"Fits now on: {', '.join(fits)}" if fits else "Fits now on: no node")
    lines += [f"! {w}" for w in plan["warnings"]]
    return "\n".join(lines)


class ServeDialog(FormDialog):
    """The serve form: asks the planner as the source and shape are typed (and on Plan),
    and shows its estimate before anything is submitted."""

    DEFAULT_CSS = """
    ServeDialog #plan {
        border: round $primary-lighten-2;
        padding: 0 1;
        height: auto;
        min-height: 3;
    }
    """

    def __init__(self, api: ConsoleApi) -> None:
        super().__init__("Serve a model", SERVE_FIELDS, submit="Serve", action=self.serve)
        self.api = api
        self.timer: Timer | None = None

    def compose_extra(self) -> ComposeResult:
        yield Static("Plan: type a source to see what it needs and where it fits.", id="plan")

    def compose_buttons(self) -> ComposeResult:
        yield Button("Plan", id="plan-button")

    async def serve(self, values: Values) -> ModelJson:
        body = {k: v for k, v in values.items() if v is not None}
        return await self.api.serve(body)

    @on(Input.Changed)
    def changed(self, event: Input.Changed) -> None:
        if event.input.id and event.input.id.removeprefix("field-") in PLANNED:
            if self.timer is not None:
                self.timer.stop()
            self.timer = self.set_timer(PLAN_DELAY, self.ask_plan)

    @on(Button.Pressed, "#plan-button")
    def ask_plan(self) -> None:
        self.run_plan()

    @work(exclusive=True, group="plan")
    async def run_plan(self) -> None:
        shown = self.query_one("#plan", Static)
        try:
            values = self.values()
        except ValueError as exc:
            shown.update(f"Plan: {exc}")
            return
        if not values["source"]:
            return
        shown.update("Plan: asking the planner…")
        try:
            plan = await self.api.plan(plan_query(values))
        except AdminError as exc:
            shown.update(f"Plan: {exc}")
            return
        shown.update(plan_summary(plan))


def cpu_speed(m: ModelJson) -> str:
    """The fastest CPU profile's estimated reply speed, with a warning when slow."""
    speeds = [
        speed
        for p in m.get("profiles") or []
        if isinstance(speed := p.get("cpu_tokens_per_second"), int | float)
    ]
    if not speeds:
        return DASH
    best = max(speeds)
    return f"~{best:.1f} tok/s" + (" (slow)" if best < 2 else "")


class ModelsPane(Pane):
    TITLE = "Models"
    ID = "models"
    KEY = "3"
    KEYS = (
        ("s", "Serve…"),
        ("x", "Stop"),
        ("t", "Start"),
        ("R", "Restart"),
        ("c", "Context…"),
        ("g", "GPUs…"),
        ("p", "Replicas…"),
        ("D", "Remove…"),
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "serve", "Serve…"),
        Binding("x", "stop", "Stop"),
        Binding("t", "start", "Start"),
        Binding("R", "restart", "Restart"),
        Binding("c", "context", "Context…"),
        Binding("g", "gpus", "GPUs…"),
        Binding("p", "replicas", "Replicas…"),
        Binding("delete,D", "remove", "Remove…"),
    ]

    def compose(self) -> ComposeResult:
        yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)

    def update_from(self, snapshot: Snapshot) -> None:
        rows = {}
        for m in snapshot.models:
            profiles = ", ".join(
                f"{p['name']} {(p.get('status') or NO_STATUS)['ready']}/{p['replicas']}"
                for p in m.get("profiles") or []
            )
            notes = [(p.get("status") or NO_STATUS)["note"] for p in m.get("profiles") or []]
            rows[m["name"]] = (
                m["name"],
                m["state"],
                f"{m['ready']}/{m['desired']}",
                m["engine"],
                str(m["context"]),
                str(m["max_output"] or DASH),
                profiles or DASH,
                cpu_speed(m),
                m.get("parked") or "; ".join(n for n in notes if n),
            )
        fill(self.query_one(DataTable), COLUMNS, rows)

    # ------------------------------------------------------------------ helpers

    def selected(self) -> ModelJson | None:
        """The model under the cursor, as the last snapshot showed it."""
        table = self.query_one(DataTable)
        if not table.row_count:
            self.app.notify("No model to act on: serve one with s", severity="warning")
            return None
        key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        for m in self.console.snapshot.models:
            if m["name"] == key:
                return m
        return None

    def done(self, what: str) -> Callable[[object], None]:
        """A dialog's callback: say what was done (unless cancelled) and refresh."""

        def after(result: object) -> None:
            if result is not None and result is not False:
                self.app.notify(what)
                self.console.action_refresh_now()

        return after

    @work(group="model-actions")
    async def act(self, what: str, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except AdminError as exc:
            self.app.notify(str(exc), title=what, severity="error", timeout=10)
            return
        self.app.notify(what)
        self.console.action_refresh_now()

    # ------------------------------------------------------------------ actions

    def action_serve(self) -> None:
        def after(result: object) -> None:
            if isinstance(result, dict):
                self.app.notify(f"Serving {result.get('name')}: {result.get('state')}")
                self.console.action_refresh_now()

        self.app.push_screen(ServeDialog(self.console.api), after)

    def action_stop(self) -> None:
        if m := self.selected():
            name = m["name"]
            self.act(f"Stopped {name}", lambda: self.console.api.change_model(name, "stop"))

    def action_start(self) -> None:
        if m := self.selected():
            name = m["name"]
            self.act(f"Started {name}", lambda: self.console.api.change_model(name, "start"))

    def action_restart(self) -> None:
        if not (m := self.selected()):
            return
        name = m["name"]

        def after(yes: bool | None) -> None:
            if yes:
                self.act(
                    f"Restarting {name}: its replicas are replaced one by one",
                    lambda: self.console.api.change_model(name, "restart"),
                )

        question = f"Replace every replica of {name}, one by one?"
        self.app.push_screen(ConfirmDialog(f"Restart {name}", question, "Restart"), after)

    def action_context(self) -> None:
        if not (m := self.selected()):
            return
        name = m["name"]
        current = {"context": m["context"], "slots": m["slots"], "max_output": m["max_output"]}

        async def change(values: Values) -> ModelJson:
            body: dict[str, object] = {
                k: values[k] for k in current if values[k] is not None and values[k] != current[k]
            }
            if not body:
                raise ValueError("Nothing changed.")
            body["in_place"] = values["in_place"]
            return await self.console.api.change_model(name, "context", body)

        fields = (
            Field("context", "Tokens", "int", m["context"], required=True),
            Field("slots", "Slots", "int", m["slots"], required=True),
            Field("max_output", "Max output", "int", m["max_output"], "longest answer in tokens"),
            Field("in_place", "In place: stop each replica before its replacement", "bool"),
        )
        message = (
            "Replicas restart one by one with the new context; the longest answer alone "
            "restarts nothing."
        )
        dialog = FormDialog(
            f"Context length of {m['name']}",
            fields,
            message=message,
            submit="Change",
            action=change,
        )
        self.app.push_screen(dialog, self.done(f"Changed the context of {m['name']}"))

    def first_profile(self, m: ModelJson) -> ProfileJson | None:
        profiles = m.get("profiles") or []
        return profiles[0] if profiles else None

    def action_gpus(self) -> None:
        if not (m := self.selected()):
            return
        name = m["name"]
        profile = self.first_profile(m)

        async def change(values: Values) -> ModelJson:
            body = {"gpus": values["gpus"], "in_place": values["in_place"]}
            if values["profile"]:
                body["profile"] = values["profile"]
            return await self.console.api.change_model(name, "gpus", body)

        cards = profile["cards"] if profile else 0
        fields = (
            Field("gpus", "Cards per replica", "int", cards, required=True),
            Field("profile", "Profile", "text", profile["name"] if profile else None),
            Field("in_place", "In place: stop each replica before its replacement", "bool"),
        )
        dialog = FormDialog(f"GPUs of {m['name']}", fields, submit="Change", action=change)
        self.app.push_screen(dialog, self.done(f"Changed the cards of {m['name']}"))

    def action_replicas(self) -> None:
        if not (m := self.selected()):
            return
        name = m["name"]
        profile = self.first_profile(m)
        names = ", ".join(p["name"] for p in m.get("profiles") or [])

        async def change(values: Values) -> ModelJson:
            body = {"replicas": values["replicas"]}
            if values["profile"]:
                body["profile"] = values["profile"]
            return await self.console.api.change_model(name, "replicas", body)

        replicas = profile["replicas"] if profile else 1
        fields = (
            Field("replicas", "Replicas", "int", replicas, required=True),
            Field("profile", "Profile", "text", profile["name"] if profile else None),
        )
        message = f"Profiles: {names or 'none'}. A new profile name adds a CPU profile below them."
        dialog = FormDialog(
            f"Replicas of {m['name']}", fields, message=message, submit="Set", action=change
        )
        self.app.push_screen(dialog, self.done(f"Changed the replicas of {m['name']}"))

    def action_remove(self) -> None:
        if not (m := self.selected()):
            return
        name = m["name"]

        async def remove(values: Values) -> ModelRemovedJson:
            return await self.console.api.remove_model(name, bool(values["with_files"]))

        fields = (Field("with_files", "With files: also delete its weights on the nodes", "bool"),)
        message = f"Take {name} out of the catalog and stop its replicas?"
        dialog = FormDialog(
            f"Remove {name}", fields, message=message, submit="Remove", action=remove, danger=True
        )
        self.app.push_screen(dialog, self.done(f"Removed {name}"))
