"""``llmgw server init`` as a form: data dir, addresses, what it will create, then the
admin token, shown once. It runs the flag form's own code (``llmgw.server.datadir.init``,
handed in by the command line as ``InitHooks``, since the console never imports the
control plane), so the two cannot drift apart; a refusal is shown in the form and
nothing is changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Footer, Input, Label, Static

from llmgw.client.admin import local_url
from llmgw.config import ConfigError, ServerConfig, parse_hostport


@dataclass(frozen=True)
class InitHooks:
    """What the form needs of the control plane's data dir code."""

    # (root, listen=, agent_port=, advertise=) -> (ServerConfig, admin token)
    init: Callable[..., tuple[ServerConfig, str]]
    # What of a data dir is already there.
    existing: Callable[[Path], list[str]]
    # This machine's addresses, for a host name.
    default_advertise: Callable[[str], list[str]]
    # Where a data dir keeps its admin token.
    token_path: Callable[[Path], Path]
    # The refusals init raises, shown in the form.
    errors: tuple[type[Exception], ...]


DEFAULT_LISTEN = "0.0.0.0:8080"
DEFAULT_AGENT_PORT = 8443
# What init writes, in the words an operator checks them by.
CREATES = (
    ("server.yaml", "settings"),
    ("pki/ca.crt, pki/ca.key", "the cluster's CA, which signs every node's certificate"),
    ("pki/server.crt, pki/server.key", "the control plane's certificate"),
    ("cluster.key", "seals secrets in the store"),
    ("store.db", "the store (SQLite)"),
    ("admin.token", "the first admin token, readable by you alone"),
)

FORM_CSS = """
#form { border: round $primary; border-title-align: left; padding: 0 1; height: 1fr; }
.row { height: 3; }
.row Label { width: 36; padding: 1 1 0 0; }
.row Input { width: 1fr; }
#summary { margin: 1 0 0 0; color: $text-muted; }
#error { color: $error; margin: 1 0 0 0; }
#done { margin: 1 0 0 0; }
#token { color: $success; text-style: bold; padding: 0 2; }
#actions { height: 3; margin: 1 0 0 0; }
"""


@dataclass(frozen=True)
class SetupResult:
    root: Path
    config: ServerConfig
    token: str


def _row(label: str, field: Input) -> Horizontal:
    return Horizontal(Label(label), field, classes="row")


class SetupApp(App[SetupResult | None]):
    """The setup form; exits with what it created, or None when left without creating."""

    CSS = resources.files("llmgw.tui").joinpath("console.tcss").read_text() + FORM_CSS
    TITLE = "llmgw"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "create", "Create"),
        Binding("escape", "leave", "Leave"),
    ]

    def __init__(self, root: Path, hooks: InitHooks) -> None:
        super().__init__()
        self.root = root
        self.hooks = hooks
        self.result: SetupResult | None = None

    def compose(self) -> ComposeResult:
        yield Static("llmgw · server init · a new control plane", id="title")
        with Vertical(id="form"):
            yield _row("Data dir", Input(str(self.root), id="data-dir"))
            yield _row("Listen (HTTP: /v1, /api/v1, /admin)", Input(DEFAULT_LISTEN, id="listen"))
            yield _row(
                "Agents' port (mutual TLS, HTTP/2)",
                Input(str(DEFAULT_AGENT_PORT), id="agent-port", type="integer"),
            )
            yield _row(
                "Advertised addresses (comma between)",
                Input(id="advertise", placeholder="found on this machine"),
            )
            yield Static(id="summary")
            yield Static(id="error")
            with Horizontal(id="actions"):
                yield Button("Create", id="create", variant="primary")
            yield Static(id="done")
            yield Static(id="token")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#form").border_title = "Set up a control plane"
        for name in ("#error", "#done", "#token"):
            self.query_one(name).display = False
        self.show_summary()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self.result is None:
            self.show_summary()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_create()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "create":
            self.action_create()

    def value(self, field: str) -> str:
        return self.query_one(f"#{field}", Input).value.strip()

    def advertise(self) -> list[str]:
        return [a.strip() for a in self.value("advertise").split(",") if a.strip()]

    def show_summary(self) -> None:
        root = Path(self.value("data-dir")).expanduser()
        lines = [f"It will create, in {root}:"]
        lines += [f"  {name:<32} {what}" for name, what in CREATES]
        try:
            host, _ = parse_hostport(self.value("listen"))
            found = ", ".join(self.advertise() or self.hooks.default_advertise(host))
            lines.append(f"Agents will be told to reach it at: {found}")
        except ConfigError:
            pass
        present = self.hooks.existing(root) if self.value("data-dir") else []
        if present:
            lines.append(f"{root} already holds {', '.join(present)}: it will not be touched.")
        self.query_one("#summary", Static).update("\n".join(lines))

    def fail(self, message: str) -> None:
        error = self.query_one("#error", Static)
        error.update(message)
        error.display = True

    def action_create(self) -> None:
        if self.result is not None:
            self.exit(self.result)
            return
        if not self.value("data-dir"):
            self.fail("Data dir: give the directory to create the control plane in.")
            return
        port = self.value("agent-port")
        if not port.isdigit():
            self.fail("Agents' port: give a port number, like 8443.")
            return
        self.query_one("#error").display = False
        self.query_one("#create", Button).disabled = True
        root = Path(self.value("data-dir")).expanduser()
        self.create(root, self.value("listen"), int(port), self.advertise())

    @work(thread=True, exclusive=True, group="init")
    def create(self, root: Path, listen: str, agent_port: int, advertise: list[str]) -> None:
        # A thread: init runs its own event loop to create the store.
        refusals: tuple[type[Exception], ...] = (*self.hooks.errors, ConfigError)
        try:
            config, token = self.hooks.init(
                root, listen=listen, agent_port=agent_port, advertise=advertise or None
            )
        except refusals as exc:
            self.call_from_thread(self.refused, str(exc))
            return
        self.call_from_thread(self.created, SetupResult(root, config, token))

    def refused(self, message: str) -> None:
        self.fail(message)
        self.query_one("#create", Button).disabled = False

    def created(self, result: SetupResult) -> None:
        self.result = result
        root, config = result.root, result.config
        for field in self.query(Input):
            field.disabled = True
        self.query_one("#summary").display = False
        button = self.query_one("#create", Button)
        button.label = "Done"
        button.disabled = False
        button.focus()
        self.query_one("#done", Static).update(
            f"Initialised the control plane in {root}\n"
            f"  HTTP (/v1, /api/v1, /admin): {config.listen}  ->  {local_url(config.listen)}\n"
            f"  agents' port (mutual TLS, HTTP/2): {config.agent_port}\n"
            f"  advertised as: {', '.join(config.advertise)}\n\n"
            f"Admin token (shown once; also kept, readable by you alone, in "
            f"{self.hooks.token_path(root)}):"
        )
        self.query_one("#token", Static).update(result.token)
        self.query_one("#done").display = True
        self.query_one("#token").display = True
        self.query_one("#form").border_title = "Created"
        self.notify(f"Next: llmgw server run --data-dir {root}", timeout=30)

    def action_leave(self) -> None:
        self.exit(self.result)
