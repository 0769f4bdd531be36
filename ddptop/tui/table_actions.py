"""The dashboard's keys on its rank table: a rank's detail, the selected ranks' stacks,
filtering, sorting and the sort order.

A base of :class:`~ddptop.tui.app.DdptopApp` (beside :mod:`ddptop.tui.replay_actions`), so
that the app keeps to wiring and redrawing; each key pushes a screen
(:mod:`ddptop.tui.screens`) or asks the table (:mod:`ddptop.tui.widgets.rank_table`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from textual import events
from textual.app import App

from ddptop.model.job import JobModel
from ddptop.source import JobSource
from ddptop.tui.key_first import KeyFirst
from ddptop.tui.screens.detail import RankDetail
from ddptop.tui.screens.filter import FilterPrompt
from ddptop.tui.screens.stacks import StacksScreen
from ddptop.tui.widgets.rank_table import RankTable

# The longest a key holds the UI busy (its repaint releases it sooner): the threads that give
# way also wait at most GIVE_WAY_MAX_S at a time (ddptop.source).
KEY_HOLD_MAX_S = 0.5


class TableActions(App[int]):
    """The rank table's keys of :class:`~ddptop.tui.app.DdptopApp` (bound to keys there)."""

    source: JobSource  # set by the app
    model: JobModel  # set by the app: the job as shown
    replay = False  # set by the app: whether the source replays a recording

    def __init__(self) -> None:
        super().__init__()
        # Keys sent on to the focused widget, with their holds' releases, until they come back
        # to the app; one a widget kept for itself falls off the end.
        self._held_keys: deque[tuple[events.Key, Callable[[], None]]] = deque(maxlen=64)
        self.key_first = KeyFirst()  # the UI's upkeep waits while a key is on its way

    def resume_upkeep(self, kind: str) -> None:
        """Ask again for upkeep of *kind* that waited for keys (:mod:`ddptop.tui.key_first`)."""

    def now(self) -> float:
        """The time the dashboard shows (the app's clock, or the replay's position)."""
        raise NotImplementedError

    async def on_event(self, event: events.Event) -> None:
        """A person's key holds the UI busy until the screen shows what it did: the threads
        that give way (the source's, a big job's background diagnosis) wait through all of
        it, not only through its action (Textual's steps between the handlers were shared
        with them). At 32,768 ranks on a busy node, keys at a person's pace, three turns each
        (``bench/key_hold_ab.py``): while a background diagnosis ran, median 22 against 36 ms,
        p90 80 against 106; between diagnoses 8 against 9, p90 52 against 60. Released after
        the repaint, or after KEY_HOLD_MAX_S."""
        if not isinstance(event, events.Key) or event.is_forwarded:
            await super().on_event(event)
            return
        release = self._hold_for_key()
        self.set_timer(KEY_HOLD_MAX_S, release)
        try:
            await super().on_event(event)  # an app binding, or the key sent on to the focused widget
        finally:
            if event.is_forwarded:  # released when it comes back to the app (on_key)
                self._held_keys.append((event, release))
            else:  # a priority binding, run above: after the repaint that follows
                self.call_after_refresh(release)

    def _hold_for_key(self) -> Callable[[], None]:
        # The threads that give way wait, and the UI's own upkeep (KeyFirst), until released
        # (once counts: the repaint's release and the timer's).
        self.key_first.arrived()
        return self.source.foreground.hold(key=True, then=self._key_shown)

    def _key_shown(self) -> None:
        for kind in self.key_first.shown():
            self.resume_upkeep(kind)

    def on_key(self, event: events.Key) -> None:
        """A key back from the focused widget, its bindings run next by Textual's ``App._on_key``
        in this same dispatch: its hold is released after the repaint that follows. (Released
        from the widget's queue instead, it could go before the binding's action ran.) A key a
        widget keeps for itself is released by the timer."""
        for i, (held, release) in enumerate(self._held_keys):
            if held is event:
                del self._held_keys[i]
                self.call_after_refresh(release)
                return

    def on_rank_table_chosen(self, message: RankTable.Chosen) -> None:
        """Enter on a row: the rank's detail."""
        self.open_detail(message.rank)

    def open_detail(self, rank: int) -> None:
        """Push the detail screen of *rank* (error note if unknown)."""
        view = self.model.ranks.get(rank)
        if view is None:
            self.notify(f"rank {rank}: nothing received yet", severity="warning")
            return
        self.push_screen(RankDetail(view, view.status(self.now()), self.now(), self.source))

    def action_stacks(self) -> None:
        """Stacks of the selected ranks (all when none is selected), grouped."""
        if self.replay:
            self.notify("stacks need a live job (replay shows recorded stacks in the detail)",
                        severity="warning")
            return
        selected = sorted(self.query_one(RankTable).selected)
        self.push_screen(StacksScreen(self.source, selected or None))

    def action_filter(self) -> None:
        """Prompt for a filter."""
        table = self.query_one(RankTable)

        def apply(query: str | None) -> None:
            if query is None:
                return
            shown = table.set_filter(query)
            if not query.strip():
                self.notify("filter cleared")
            elif shown:
                self.notify(f"filter {query!r}: {shown} rank(s)")
            else:
                self.notify(f"filter {query!r} matches no rank", severity="warning")

        self.push_screen(FilterPrompt(table.filter_query), apply)

    def quiet_toasts(self) -> bool:
        """Whether a key's confirmation toast is left out (the app says: a big job)."""
        return False

    def action_sort(self, delta: int) -> None:
        """Sort by the previous/next column (its title shows ▲ or ▼)."""
        with self.source.foreground.busy():  # a sort of 32,768 ranks: tens of ms
            key = self.query_one(RankTable).cycle_sort(delta)
        if not self.quiet_toasts():
            self.notify(f"sorted by {key}", timeout=2)

    def action_toggle_order(self) -> None:
        """Reverse the sort order."""
        with self.source.foreground.busy():
            desc = self.query_one(RankTable).toggle_order()
        if not self.quiet_toasts():
            self.notify("descending" if desc else "ascending", timeout=2)
