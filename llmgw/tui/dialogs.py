"""The console's dialogs: a confirmation, a form built from field specs, and a message.

Each is a modal screen: Escape cancels, Enter submits, and the mouse works through the
buttons. A form may be given the call that acts on its values; it then runs the call
itself and shows the control plane's refusal inside the form, so the operator can fix
the value and try again instead of starting over.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from llmgw.client import ctl_models
from llmgw.client.adminbase import AdminError

Kind = Literal["text", "int", "float", "size", "bool"]
# A field's typed value: text, a number, a size in bytes, a tick; None when left empty.
Value = str | int | float | bool | None
Values = dict[str, Value]
# What a form's submit does with its values; what it returns is the form's result.
Action = Callable[[Values], Awaitable[object]]
# What a dialog is dismissed with.
R = TypeVar("R")


def parse_size(text: str) -> int:
    """'8GiB', '8G', '512MiB', '1.5T' or plain bytes; ValueError says what was wrong."""
    try:
        return ctl_models.parse_size(text)
    except ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class Field:
    """One line of a form: ``name`` is its key in the values, ``label`` what it shows."""

    name: str
    label: str
    kind: Kind = "text"
    default: Value = None
    placeholder: str = ""
    required: bool = False

    def parse(self, raw: str) -> Value:
        """The typed value of ``raw``; None when left empty; ValueError when not valid."""
        text = raw.strip()
        if not text:
            if self.required:
                raise ValueError(f"{self.label}: required")
            return None
        try:
            if self.kind == "int":
                return int(text)
            if self.kind == "float":
                return float(text)
            if self.kind == "size":
                return parse_size(text)
        except ValueError:
            what = {"int": "a whole number", "float": "a number", "size": "a size"}[self.kind]
            raise ValueError(f"{self.label}: {text!r} is not {what}") from None
        return text


class Tick(Checkbox, inherit_bindings=False):
    """A checkbox that toggles with Space only, so Enter still submits its form."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("space", "toggle_button", "Toggle")]


class Dialog(ModalScreen[R]):
    """The frame every dialog shares: a bordered box in the middle of the screen."""

    DEFAULT_CSS = """
    Dialog {
        align: center middle;
    }
    Dialog > #box {
        width: 90;
        max-width: 95%;
        height: auto;
        max-height: 95%;
        border: thick $primary;
        background: $surface;
        padding: 0 1;
    }
    Dialog #heading {
        text-style: bold;
        width: 1fr;
        margin-bottom: 1;
    }
    Dialog #message {
        margin-bottom: 1;
    }
    Dialog #buttons {
        height: auto;
        align-horizontal: right;
        margin-top: 1;
    }
    Dialog #buttons Button {
        margin-left: 2;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmDialog(Dialog[bool]):
    """A question; dismisses with True for yes and False for no (Escape)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n", "cancel", "Cancel"),
        Binding("y", "confirm", "Yes"),
    ]

    def __init__(self, title: str, question: str, yes: str = "Yes") -> None:
        super().__init__()
        self.heading = title
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Label(self.heading, id="heading")
            yield Static(self.question, id="message", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button(self.yes, id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#confirm", Button).focus()

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_confirm(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#confirm")
    def confirmed(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#cancel")
    def cancelled(self) -> None:
        self.dismiss(False)


class FormDialog(Dialog[object]):
    """A form from ``fields``. Submitting parses the values (the error shown beside the
    buttons when one is not valid); with no ``action`` it dismisses with the values,
    with one it awaits ``action(values)`` and dismisses with what that returned, or shows
    the control plane's message (or the action's ValueError) and stays. Cancelling
    dismisses with None."""

    DEFAULT_CSS = """
    FormDialog #fields {
        height: auto;
        max-height: 24;
    }
    FormDialog .row {
        height: 1;
        margin-bottom: 1;
    }
    FormDialog .row Label {
        width: 22;
    }
    FormDialog .row Input {
        width: 1fr;
    }
    FormDialog #form-error {
        color: $error;
        margin-top: 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("enter", "submit", "Submit", show=False),
    ]

    def __init__(
        self,
        title: str,
        fields: Sequence[Field],
        *,
        message: str = "",
        submit: str = "OK",
        action: Action | None = None,
        danger: bool = False,
    ) -> None:
        super().__init__()
        self.heading = title
        self.fields = tuple(fields)
        self.message = message
        self.submit_label = submit
        self.action = action
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Label(self.heading, id="heading")
            if self.message:
                yield Static(self.message, id="message", markup=False)
            with VerticalScroll(id="fields"):
                for f in self.fields:
                    if f.kind == "bool":
                        yield Tick(f.label, bool(f.default), id=f"field-{f.name}", compact=True)
                        continue
                    with Horizontal(classes="row"):
                        yield Label(f.label + ("*" if f.required else ""))
                        value = "" if f.default is None else str(f.default)
                        yield Input(value, f.placeholder, id=f"field-{f.name}", compact=True)
            yield from self.compose_extra()
            yield Static("", id="form-error", markup=False)
            with Horizontal(id="buttons"):
                yield from self.compose_buttons()
                yield Button("Cancel", id="cancel")
                yield Button(
                    self.submit_label, id="submit", variant="error" if self.danger else "primary"
                )

    def compose_extra(self) -> ComposeResult:
        """What a form shows below its fields; nothing here."""
        yield from ()

    def compose_buttons(self) -> ComposeResult:
        """Buttons before Cancel and the submit button; none here."""
        yield from ()

    def on_mount(self) -> None:
        first = self.query("#fields Input, #fields Tick").first()
        first.focus()

    def raw(self, name: str) -> str:
        return self.query_one(f"#field-{name}", Input).value

    def values(self) -> Values:
        """Every field's typed value; ValueError names the first that is not valid."""
        out: Values = {}
        for f in self.fields:
            if f.kind == "bool":
                out[f.name] = self.query_one(f"#field-{f.name}", Tick).value
            else:
                out[f.name] = f.parse(self.raw(f.name))
        return out

    def show_error(self, text: str) -> None:
        self.query_one("#form-error", Static).update(text)

    def action_submit(self) -> None:
        self.run_submit()

    @on(Input.Submitted)
    @on(Button.Pressed, "#submit")
    def submitted(self) -> None:
        self.run_submit()

    @on(Button.Pressed, "#cancel")
    def cancelled(self) -> None:
        self.dismiss(None)

    @work(exclusive=True, group="submit")
    async def run_submit(self) -> None:
        try:
            values = self.values()
            self.check(values)
        except ValueError as exc:
            self.show_error(str(exc))
            return
        if self.action is None:
            self.dismiss(values)
            return
        self.show_error("")
        submit = self.query_one("#submit", Button)
        submit.disabled = True
        try:
            result = await self.action(values)
        except (AdminError, ValueError) as exc:
            self.show_error(str(exc))
            return
        finally:
            submit.disabled = False
        self.dismiss(values if result is None else result)

    def check(self, values: Values) -> None:
        """Raise ValueError when the values together make no sense; all pass here."""


class MessageDialog(Dialog[None]):
    """Text to read (and select); ``copy`` adds a Copy button and key for that text."""

    DEFAULT_CSS = """
    MessageDialog #copyable {
        border: round $accent;
        padding: 0 1;
        height: auto;
    }
    MessageDialog #warning {
        color: $warning;
        margin-top: 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter", "cancel", "Close"),
        Binding("c", "copy", "Copy"),
    ]

    def __init__(self, title: str, body: str, *, copy: str = "", warning: str = "") -> None:
        super().__init__()
        self.heading = title
        self.body = body
        self.copy = copy
        self.warning = warning

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Label(self.heading, id="heading")
            if self.body:
                yield Static(self.body, id="message", markup=False)
            if self.copy:
                yield Static(self.copy, id="copyable", markup=False)
            if self.warning:
                yield Static(self.warning, id="warning", markup=False)
            with Horizontal(id="buttons"):
                if self.copy:
                    yield Button("Copy", id="copy")
                yield Button("Close", id="close", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#close", Button).focus()

    def action_copy(self) -> None:
        if self.copy:
            # OSC 52: reaches the operator's clipboard over ssh where the terminal allows.
            self.app.copy_to_clipboard(self.copy)
            self.app.notify("Copied to the clipboard (where the terminal allows it)")

    @on(Button.Pressed, "#copy")
    def copy_pressed(self) -> None:
        self.action_copy()

    @on(Button.Pressed, "#close")
    def close_pressed(self) -> None:
        self.dismiss(None)
