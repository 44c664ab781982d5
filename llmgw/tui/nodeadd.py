"""``llmgw node add`` as a form: host, ssh user, port and key, prefix and node id, then
the node's progress, line by line, until it is Ready or a step fails with its reason.

It runs the command's own code (``llmgw.client.nodeadd.add_node``) in a thread, so the two
cannot drift apart; what that code prints reaches the form through Textual's print
capture, and the end is posted after the last line, so the two arrive in order."""

from __future__ import annotations

import argparse
import getpass
import sys
from importlib import resources
from typing import ClassVar

from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Footer, Input, Label, Log, Static

from llmgw.client.admin import AdminClient
from llmgw.client.nodeadd import add_node

FORM_CSS = """
#form { border: round $primary; border-title-align: left; padding: 0 1; height: 1fr; }
.row { height: 3; }
.row Label { width: 14; padding: 1 1 0 0; }
.row Input { width: 1fr; }
#actions { height: 3; }
#state { height: auto; margin: 0 0 1 0; }
#state.ready { color: $success; text-style: bold; }
#state.failed { color: $error; text-style: bold; }
#progress { height: 1fr; border: round $primary-lighten-2; }
"""
FIELDS = (
    ("host", "Host", "the node's address or ssh name"),
    ("user", "ssh user", ""),
    ("ssh-port", "ssh port", ""),
    ("ssh-key", "ssh key", "ssh's own default identities"),
    ("prefix", "Prefix", ""),
    ("node-id", "Node id", "the node's hostname"),
)


class NodeAddApp(App[int]):
    """The node-add form; exits with 0 once a node went Ready, 1 otherwise."""

    CSS = resources.files("llmgw.tui").joinpath("console.tcss").read_text() + FORM_CSS
    TITLE = "llmgw"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "add", "Add node"),
        Binding("escape", "leave", "Leave"),
    ]

    class Finished(Message):
        def __init__(self, code: int) -> None:
            super().__init__()
            self.code = code

    def __init__(self, client: AdminClient, defaults: argparse.Namespace) -> None:
        super().__init__()
        self.client = client
        # The command's other options (--zipapp, --ssh-option, --timeout, ...) carry over.
        self.defaults = defaults
        self.code = 1
        self.running = False
        self.partial = {False: "", True: ""}
        self.errors: list[str] = []

    def compose(self) -> ComposeResult:
        d = self.defaults
        values = {
            "host": d.host or "",
            "user": d.user or "",
            "ssh-port": str(d.ssh_port),
            "ssh-key": d.ssh_key or "",
            "prefix": d.prefix,
            "node-id": d.node_id or "",
        }
        placeholders = {"user": getpass.getuser()}
        yield Static(f"llmgw · node add · {self.client.base_url}", id="title")
        with Vertical(id="form"):
            for key, label, hint in FIELDS:
                field = Input(
                    values[key],
                    id=key,
                    placeholder=placeholders.get(key, hint),
                    type="integer" if key == "ssh-port" else "text",
                )
                yield Horizontal(Label(label), field, classes="row")
            with Horizontal(id="actions"):
                yield Button("Add node", id="add", variant="primary")
            yield Static(id="state")
            yield Log(id="progress", auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#form").border_title = "Add a node over ssh"
        self.query_one("#progress").display = False
        self.begin_capture_print(self)

    def value(self, field: str) -> str:
        return self.query_one(f"#{field}", Input).value.strip()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_add()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "add":
            self.action_add()

    def say(self, text: str, kind: str = "") -> None:
        state = self.query_one("#state", Static)
        state.update(text)
        state.set_classes(kind)

    def action_add(self) -> None:
        if self.running:
            return
        host = self.value("host")
        if not host:
            self.say("Host: give the node's address.", "failed")
            return
        port = self.value("ssh-port") or "22"
        if not port.isdigit():
            self.say("ssh port: give a port number, like 22.", "failed")
            return
        args = argparse.Namespace(**vars(self.defaults))
        args.host = host
        args.user = self.value("user") or None
        args.ssh_port = int(port)
        args.ssh_key = self.value("ssh-key") or None
        args.prefix = self.value("prefix") or self.defaults.prefix
        args.node_id = self.value("node-id") or None
        self.running = True
        self.errors = []
        self.query_one("#add", Button).disabled = True
        log = self.query_one("#progress", Log)
        log.clear()
        log.display = True
        self.say(f"Adding {host}…")
        self.install(args)

    @work(thread=True, exclusive=True, group="node-add")
    def install(self, args: argparse.Namespace) -> None:
        # A thread: add_node blocks on ssh and on polling the control plane.
        try:
            code = add_node(args, self.client)
        except Exception as exc:
            # The form shows any failure as its reason rather than losing the screen.
            print(f"llmgw: node add {args.host}: {exc}", file=sys.stderr)
            code = 1
        self.post_message(self.Finished(code))

    def on_print(self, event: events.Print) -> None:
        text = self.partial[event.stderr] + event.text
        *lines, self.partial[event.stderr] = text.split("\n")
        log = self.query_one("#progress", Log)
        for line in lines:
            log.write_line(line)
            if event.stderr and line.strip():
                self.errors.append(line.strip())

    def on_node_add_app_finished(self, message: Finished) -> None:
        for stderr, rest in self.partial.items():
            if rest:
                self.on_print(events.Print("\n", stderr=stderr))
        self.running = False
        self.code = message.code
        self.query_one("#add", Button).disabled = False
        if message.code == 0:
            self.say("Ready: the node has joined and is serving.", "ready")
            return
        reason = self.errors[0] if self.errors else "see the lines below"
        self.say(f"Failed: {reason.removeprefix('llmgw: ')}", "failed")

    def action_leave(self) -> None:
        self.exit(self.code)
