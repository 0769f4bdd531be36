"""Stacks screen (`s`): fetch stacks in a worker thread, show identical stacks grouped."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddptop.source import JobSource, StacksResult
from ddptop.textfmt import rank_ranges
from ddptop.tui.stack_groups import group_stacks, render_groups

log = logging.getLogger(__name__)

STACKS_TIMEOUT_S = 5.0


def stacks_text(result: StacksResult) -> Text:
    """Grouped stacks as text: summaries in bold, frames dim, failures in red."""
    groups = group_stacks(result.stacks)
    text = Text()
    body = render_groups(groups, result.errors)
    for line in body.splitlines():
        if line.startswith("rank") and ": no stack" in line:
            text.append(line + "\n", style="red")
        elif line.startswith("rank"):
            text.append(line + "\n", style="bold")
        else:
            text.append(line + "\n", style="dim")
    return text


class StacksScreen(Screen[None]):
    """Asks the source for stacks (off the UI thread) and shows them grouped."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "app.pop_screen", "back"),
                                             Binding("r", "fetch", "refetch")]

    def __init__(self, source: JobSource, ranks: Sequence[int] | None) -> None:
        super().__init__()
        self.source = source
        self.ranks = list(ranks) if ranks else None
        self.result: StacksResult | None = None

    def compose(self) -> ComposeResult:
        """Title line, scrollable body, footer."""
        which = "all ranks" if self.ranks is None else f"ranks {rank_ranges(self.ranks)}"
        yield Static(f" stacks of {which}: fetching…", id="stacks-title")
        with VerticalScroll(id="stacks-body"):
            yield Static("", id="stacks-text")
        yield Footer()

    def on_mount(self) -> None:
        """Fetch at once."""
        self.action_fetch()

    def action_fetch(self) -> None:
        """Request stacks in a worker thread (request_stacks blocks)."""
        self.run_worker(self._fetch, thread=True, exclusive=True, group="stacks")

    def _fetch(self) -> None:
        try:
            result = self.source.request_stacks(self.ranks, timeout=STACKS_TIMEOUT_S)
        except Exception as exc:  # report in the UI, never crash the app
            log.warning("stacks request failed: %s", exc)
            self.app.call_from_thread(self._failed, str(exc) or type(exc).__name__)
            return
        self.app.call_from_thread(self._show, result)

    def _show(self, result: StacksResult) -> None:
        self.result = result
        groups = group_stacks(result.stacks)
        title = (f" stacks of {len(result.stacks)} rank(s) in {len(groups)} group(s)"
                 + (f", {len(result.errors)} failed" if result.errors else ""))
        self.query_one("#stacks-title", Static).update(title)
        self.query_one("#stacks-text", Static).update(stacks_text(result))
        if result.errors and not result.stacks:
            self.notify(f"no stacks: {next(iter(result.errors.values()))}", severity="error")
        else:
            self.notify(title.strip(), severity="warning" if result.errors else "information")

    def _failed(self, why: str) -> None:
        self.query_one("#stacks-title", Static).update(f" stacks: request failed: {why}")
        self.notify(f"stacks request failed: {why}", severity="error")
