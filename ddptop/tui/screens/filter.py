"""Filter prompt (`/`): one input line; Enter applies, Escape cancels, empty clears."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class FilterPrompt(ModalScreen[str | None]):
    """Returns the query (possibly empty) or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        """A label and the input."""
        yield Label("filter ranks: 3 · 0-7 · host · status · flag (comma = or; empty clears)",
                    id="filter-label")
        yield Input(value=self.current, placeholder="e.g. 0-3,lost", id="filter-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Apply."""
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        """Leave the filter as it was."""
        self.dismiss(None)
