"""The dashboard's dialogs: help, a yes/no confirmation, a line of input, a pick from a list."""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static

HELP = """loopd-es dash: keys

Goals            p pause · r resume · R retry · N nudge · s send input · i interactive on/off
                 m switch model · a switch agent · x clear (asks first)
Post-mortem      h history (then [ and ] move the time cursor) · e explain · o write the HTML timeline
Commands tab     t terminate · k kill · c interrupt · Enter attach (Ctrl-] comes back)
Everywhere       Tab/Shift-Tab or the mouse to change tabs · arrows to select · q quit · ? this help

Everything updates as events land in the log, from any process. Every action runs the same
`loopd-es` command you could type, and its answer shows in the corner."""


T = TypeVar("T")


class _Dialog(ModalScreen[T | None], Generic[T]):
    DEFAULT_CSS = """
    _Dialog, HelpScreen, ConfirmScreen, InputScreen, PickScreen { align: center middle; }
    #dialog { width: 80%; max-width: 100; height: auto; max-height: 90%; border: thick $accent;
              background: $surface; padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss_none", "close")]

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class HelpScreen(_Dialog[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss_none", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(HELP), id="help")


class ConfirmScreen(_Dialog[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.question))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class InputScreen(_Dialog[str]):
    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.prompt))
            yield Input(id="text")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)


class PickScreen(_Dialog[str]):
    def __init__(self, prompt: str, choices: list[str]) -> None:
        super().__init__()
        self.prompt = prompt
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.prompt if self.choices else f"{self.prompt} (the host offers nothing)"))
            yield OptionList(*self.choices, id="choices")

    @on(OptionList.OptionSelected)
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[event.option_index])
