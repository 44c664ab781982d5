"""The console's frame: a title bar (cluster, leader, serving or stopped), a sidebar of
screens, a bordered main panel, and a key bar. It reads the admin API (never the
store) every two seconds in a worker, and says when the control plane cannot be
reached rather than freezing."""

from __future__ import annotations

from importlib import resources
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.widgets import ContentSwitcher, Footer, ListItem, ListView, Static

from llmgw.tui.api import ConsoleApi, Snapshot
from llmgw.tui.base import Pane
from llmgw.tui.fabrics import FabricsPane
from llmgw.tui.gpumap import GpuMapPane
from llmgw.tui.guard import GuardPane
from llmgw.tui.keys import KeysPane
from llmgw.tui.mcp import McpPane
from llmgw.tui.models import ModelsPane
from llmgw.tui.nodepage import NodePage
from llmgw.tui.nodes import NodesPane
from llmgw.tui.nvlinkracks import NvlinkRacksPane
from llmgw.tui.overview import OverviewPane
from llmgw.tui.people import OrgsPane, PeoplePane
from llmgw.tui.replicas import ReplicasPane
from llmgw.tui.signin import SignInPane
from llmgw.tui.slurm import SlurmPane

PANES: tuple[type[Pane], ...] = (
    OverviewPane,
    NodesPane,
    ModelsPane,
    ReplicasPane,
    GpuMapPane,
    KeysPane,
    FabricsPane,
    NvlinkRacksPane,
    PeoplePane,
    OrgsPane,
    SignInPane,
    SlurmPane,
    McpPane,
    GuardPane,
)
# Screens that come with their own issues; shown, not yet there.
LATER: tuple[str, ...] = ()
REFRESH_SECONDS = 2.0


class ConsoleApp(App[None]):
    CSS = resources.files("llmgw.tui").joinpath("console.tcss").read_text()
    TITLE = "llmgw"
    BINDINGS: ClassVar[list[BindingType]] = [
        # The sidebar shows each screen's key; the key bar keeps room for the pane's own.
        *(Binding(p.KEY, f"show('{p.ID}')", p.TITLE, show=False) for p in PANES),
        Binding("r", "refresh_now", "Refresh"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, api: ConsoleApi, refresh: float = REFRESH_SECONDS) -> None:
        super().__init__()
        self.api = api
        self.refresh_seconds = refresh
        self.snapshot = Snapshot()

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Static(id="banner")
        with Horizontal(id="body"):
            items = [ListItem(Static(f"{p.KEY} {p.TITLE}"), id=f"nav-{p.ID}") for p in PANES]
            items += [ListItem(Static(f"  {name} (later)"), disabled=True) for name in LATER]
            yield ListView(*items, id="sidebar")
            with ContentSwitcher(id="main", initial=PANES[0].ID):
                for pane in PANES:
                    yield pane(id=pane.ID)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#banner").display = False
        self.render_title()
        self.set_interval(self.refresh_seconds, self.action_refresh_now)
        self.action_refresh_now()

    @property
    def current(self) -> Pane:
        switcher = self.query_one(ContentSwitcher)
        pane = self.query_one(f"#{switcher.current}")
        assert isinstance(pane, Pane)
        return pane

    def action_show(self, pane_id: str) -> None:
        self.query_one(ContentSwitcher).current = pane_id
        sidebar = self.query_one(ListView)
        for i, pane in enumerate(PANES):
            if pane.ID == pane_id:
                sidebar.index = i
        self.current.border_title = self.current.TITLE
        # Keys go to the pane shown, not the sidebar: its first focusable widget.
        for widget in self.current.query("*"):
            if widget.focusable:
                widget.focus()
                break

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        if event.item.id and event.item.id.startswith("nav-"):
            self.action_show(event.item.id[4:])

    def on_list_view_highlighted(self, event: ListView.Highlighted) -> None:
        if event.item is not None and event.item.id and event.item.id.startswith("nav-"):
            self.query_one(ContentSwitcher).current = event.item.id[4:]

    def open_node(self, node_id: str) -> None:
        """A node's own page: its cards, disks, replicas and log."""
        self.push_screen(NodePage(self.api, node_id, refresh=self.refresh_seconds))

    def action_refresh_now(self) -> None:
        self.fetch()

    @work(exclusive=True, group="refresh")
    async def fetch(self) -> None:
        snapshot = await self.api.snapshot()
        self.show_snapshot(snapshot)

    def show_snapshot(self, snapshot: Snapshot) -> None:
        try:
            banner = self.query_one("#banner", Static)
        except NoMatches:
            return  # the app is closing
        if snapshot.error:
            # Keep showing the last good figures, and say they are stale.
            banner.update(f"Cannot reach the control plane: {snapshot.error}")
            banner.display = True
            return
        banner.display = False
        self.snapshot = snapshot
        self.render_title()
        for pane in PANES:
            self.query_one(f"#{pane.ID}", pane).update_from(snapshot)

    def render_title(self) -> None:
        status = self.snapshot.status
        if not status and self.snapshot.at:
            text = f"llmgw · {self.api.base_url} · your role reads no cluster status"
        elif not status:
            text = f"llmgw · {self.api.base_url} · connecting…"
        else:
            nodes = status.get("nodes") or {}
            serving = status.get("serving", "serving")
            planes = status.get("control_planes") or {}
            answering = (
                f" ({planes['answering']}/{planes['total']} control planes answer)"
                if planes.get("total", 0) > 1
                else ""
            )
            text = (
                f"llmgw {status.get('version', '')} · {self.api.base_url} · "
                f"{status.get('role') or ('leader' if status.get('leader') else 'standby')}"
                f"{answering} · "
                f"{'STOPPED' if serving == 'stopped' else 'serving'} · "
                f"{nodes.get('ready', 0)}/{nodes.get('total', 0)} nodes Ready"
            )
        self.query_one("#title", Static).update(text)
