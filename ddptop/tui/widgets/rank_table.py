"""The rank table: a Line API ScrollView that paints only the visible rows.

Not a DataTable: at 4096 ranks a DataTable costs ~100 ms per update, while painting the
~40 visible lines from plain row objects costs a few milliseconds. Sorting, filtering and
formatting are pure functions in :mod:`ddptop.tui.rows`; this widget keeps the cursor,
the selection, the sort column and the filter, and turns cells into styled segments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ddptop.tui.row_sequence import RowSequence
from ddptop.tui.rows import COLUMN_KEYS, COLUMNS, GroupRow, RankRow, cells, group_line
from ddptop.tui.sort_filter import filter_rows, sort_rows
from ddptop.tui.story_marks import CAUSE

_LINE_WIDTH = sum(c.width for c in COLUMNS) + len(COLUMNS) + 1
_FLAGS = COLUMN_KEYS.index("flags")
_How = tuple[int, str, str, bool, tuple[int, ...]]  # rows' id, filter, sort key, reverse, the leads
# A grouped table sorted by another column, or filtered, needs every rank's row: rebuilt at
# most this often (32,768 rows cost hundreds of milliseconds), not at every redraw.
FULL_ROWS_EVERY_S = 1.0


class _PaintStyles(NamedTuple):
    """The styles one paint needs, resolved once (``rich_style`` walks every ancestor's
    styles: per line it was a third of a 4096-rank redraw)."""

    base: Style
    header: Style
    sorted: Style
    desync: Style
    selected: Style
    cursor: Style
    levels: dict[str, Style]


class RankTable(ScrollView, can_focus=True):
    """One line per rank; a sticky header line; cursor, multi-selection, sort and filter."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "rank-table--header", "rank-table--sorted", "rank-table--cursor", "rank-table--desync",
        "rank-table--selected", "rank-table--ok", "rank-table--warn", "rank-table--bad",
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor(-1)", "up", show=False),
        Binding("down,j", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "cursor(-1000000000)", "first", show=False),
        Binding("end", "cursor(1000000000)", "last", show=False),
        Binding("space", "toggle_select", "select", show=False),
        Binding("enter", "choose", "detail"),
    ]

    cursor: reactive[int] = reactive(0, always_update=True)

    class Chosen(Message):
        """Enter on a row: open the rank's detail."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    class GroupChosen(Message):
        """Enter on a group row: expand or fold it."""

        def __init__(self, key: tuple[str, ...]) -> None:
            super().__init__()
            self.key = key  # (kind, *group key)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._all: list[RankRow] = []
        # A list of rows (small jobs) or a RowSequence that builds the rows painted (big ones).
        self.shown_rows: Sequence[RankRow | GroupRow] = []
        self._lazy: RowSequence | None = None
        self._every_row: Callable[[], list[RankRow]] | None = None
        # (how, the rows, what they gave): the last filter and sort, see _rebuild
        self._sorted: tuple[_How, list[RankRow], list[RankRow]] | None = None
        # (when, (column, reverse), the order): the lazy rows sorted, see _rebuild
        self._lazy_sorted: tuple[float, tuple[str, bool], RowSequence] | None = None
        self._full: tuple[float, list[RankRow]] | None = None
        self.sort_key = "rank"
        self.sort_reverse = False
        self.filter_query = ""
        self.selected: set[int] = set()
        self._styles: _PaintStyles | None = None
        # The findings' story (ddptop.tui.story_marks): a word per culprit and victim, and the
        # culprits' ranks, shown first in the default order (small jobs: one row per rank).
        self.story: dict[int, str] = {}
        self.leads: tuple[int, ...] = ()

    # ------------------------------------------------------------ data

    def set_rows(self, rows: list[RankRow]) -> None:
        """Replace the rows (keeps the cursor on the same rank when it is still shown)."""
        self._all, self._lazy, self._every_row, self._full = rows, None, None, None
        self._lazy_sorted = None
        self._rebuild()

    def set_sequence(self, rows: RowSequence, every_row: Callable[[], list[RankRow]]) -> None:
        """Show *rows*, built only when painted (jobs above GROUP_FROM_RANKS); *every_row*
        gives every rank's row for a sort by another column or a filter."""
        self._lazy, self._every_row = rows, every_row
        self._rebuild()

    def set_story(self, marks: dict[int, str], leads: list[int]) -> None:
        """Mark the culprits' and victims' rows (*marks*) and lead with the culprits' rows."""
        if marks == self.story and tuple(leads) == self.leads:
            return
        at_top = self.cursor == 0 and tuple(leads) != self.leads
        self.story, self.leads = marks, tuple(leads)
        self._sorted = None
        self._rebuild()
        if at_top:  # a cursor still at the top stays there: on the culprit's row, not on the rank it was
            self.cursor = 0

    def _rebuild(self) -> None:
        current = self.current_rank
        row = self.current_row
        group = (row.kind, *row.key) if isinstance(row, GroupRow) else None
        if self._lazy is not None and not self.filter_query and self.sort_key == "rank" \
                and not self.sort_reverse:
            self.shown_rows = self._lazy
        elif self._lazy is not None and not self.filter_query:
            # Sorted by another column: the order from the index, refreshed once a second
            # like every row's values below; only the rows painted are built.
            order, wall = (self.sort_key, self.sort_reverse), time.monotonic()
            if self._lazy_sorted is None or self._lazy_sorted[1] != order \
                    or wall - self._lazy_sorted[0] >= FULL_ROWS_EVERY_S:
                self._lazy_sorted = (wall, order, self._lazy.sorted(*order))
            self.shown_rows = self._lazy_sorted[2]
        else:
            rows = self._all if self._every_row is None else self._every_rows()
            # The same rows, filter and order as the last rebuild (a key press, a redraw between
            # two refreshes of every row): the same result, without sorting 32,768 rows again.
            how = (id(rows), self.filter_query, self.sort_key, self.sort_reverse, self.leads)
            if self._sorted is not None and self._sorted[0] == how and self._sorted[1] is rows:
                self.shown_rows = self._sorted[2]
            else:
                matching = filter_rows(rows, self.filter_query)
                # Rows come in rank order: the default sort is already done (4096 rows, every redraw).
                self.shown_rows = matching if self.sort_key == "rank" and not self.sort_reverse \
                    else sort_rows(matching, self.sort_key, self.sort_reverse)
                if self.leads and self.sort_key == "rank" and not self.sort_reverse:
                    first = set(self.leads)  # the culprits lead, then every rank in its order
                    self.shown_rows = [r for r in matching if r.rank in first] + \
                        [r for r in matching if r.rank not in first]
                self._sorted = (how, rows, self.shown_rows)
        self.virtual_size = Size(_LINE_WIDTH, len(self.shown_rows) + 1)
        shown = self.shown_rows
        idx: int | None = None
        if isinstance(shown, RowSequence):
            idx = shown.index_of_group(group) if group is not None else \
                shown.index_of(current) if current is not None else None
        elif current is not None:
            idx = next((i for i, r in enumerate(shown) if isinstance(r, RankRow) and r.rank == current), None)
        if idx is not None:
            self.cursor = idx
        self.cursor = max(0, min(self.cursor, len(self.shown_rows) - 1))
        self.refresh()

    def _every_rows(self) -> list[RankRow]:
        assert self._every_row is not None
        wall = time.monotonic()
        if self._full is None or wall - self._full[0] >= FULL_ROWS_EVERY_S:
            self._full = (wall, self._every_row())
        return self._full[1]

    @property
    def current_row(self) -> RankRow | GroupRow | None:
        """The row under the cursor, or None when no row is shown."""
        if 0 <= self.cursor < len(self.shown_rows):
            return self.shown_rows[self.cursor]
        return None

    @property
    def current_rank(self) -> int | None:
        """Rank under the cursor, or None when no row is shown (or a group row is)."""
        row = self.current_row
        return row.rank if isinstance(row, RankRow) else None

    def set_filter(self, query: str) -> int:
        """Show only rows matching *query*; returns how many rows match."""
        self.filter_query = query.strip()
        self._rebuild()
        return len(self.shown_rows)

    def cycle_sort(self, delta: int) -> str:
        """Sort by the column *delta* places left/right of the current one; returns its key."""
        idx = (COLUMN_KEYS.index(self.sort_key) + delta) % len(COLUMN_KEYS)
        self.sort_key = COLUMN_KEYS[idx]
        self._rebuild()
        return self.sort_key

    def toggle_order(self) -> bool:
        """Flip ascending/descending; returns True when now descending."""
        self.sort_reverse = not self.sort_reverse
        self._rebuild()
        return self.sort_reverse

    # ------------------------------------------------------------ actions

    def action_cursor(self, delta: int) -> None:
        """Move the cursor by *delta* rows (clamped)."""
        self.cursor = max(0, min(len(self.shown_rows) - 1, self.cursor + delta))

    def action_page(self, direction: int) -> None:
        """Move the cursor one screen up or down."""
        self.action_cursor(direction * max(1, self.size.height - 2))

    def action_toggle_select(self) -> None:
        """Add/remove the rank under the cursor to the selection (for stacks)."""
        rank = self.current_rank
        if rank is not None:
            self.selected ^= {rank}
            self.refresh()

    def action_choose(self) -> None:
        """Open the detail of the rank under the cursor, or expand/fold the group row."""
        row = self.current_row
        if isinstance(row, GroupRow):
            self.post_message(self.GroupChosen((row.kind, *row.key)))
        elif row is not None:
            self.post_message(self.Chosen(row.rank))

    def watch_cursor(self, cursor: int) -> None:
        # Keep the cursor row inside the viewport (line 0 is the sticky header).
        height = max(1, self.size.height - 1)
        top = round(self.scroll_offset.y)
        if cursor < top:
            self.scroll_to(y=cursor, animate=False)
        elif cursor >= top + height:
            self.scroll_to(y=cursor - height + 1, animate=False)
        self.refresh()

    # ------------------------------------------------------------ painting

    def notify_style_update(self) -> None:
        """CSS changed (a theme, a reload): resolve the paint styles again."""
        self._styles = None
        super().notify_style_update()

    def _paint_styles(self) -> _PaintStyles:
        if self._styles is None:
            component = self.get_component_rich_style
            self._styles = _PaintStyles(
                base=self.rich_style, header=component("rank-table--header"),
                sorted=component("rank-table--sorted"), desync=component("rank-table--desync"),
                selected=component("rank-table--selected"), cursor=component("rank-table--cursor"),
                levels={lvl: component(f"rank-table--{lvl}", partial=True) for lvl in ("ok", "warn", "bad")})
        return self._styles

    def render_line(self, y: int) -> Strip:
        """Line *y* of the viewport: the header at 0, else the row at y-1+scroll."""
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        styles = self._paint_styles()
        if y == 0:
            strip = Strip(self._header_segments(styles), _LINE_WIDTH)
        else:
            index = y - 1 + scroll_y
            if index >= len(self.shown_rows):
                return Strip.blank(width, styles.base)
            strip = Strip(self._row_segments(index, styles), _LINE_WIDTH)
        return strip.crop_extend(scroll_x, scroll_x + width, styles.base)

    def _header_segments(self, styles: _PaintStyles) -> list[Segment]:
        base, sorted_style = styles.header, styles.sorted
        segments = [Segment(" ", base)]
        for col in COLUMNS:
            title = col.title
            if col.key == self.sort_key:
                title = title + ("▼" if self.sort_reverse else "▲")
            text = title[: col.width].rjust(col.width) if col.right else title[: col.width].ljust(col.width)
            segments.append(Segment(text, sorted_style if col.key == self.sort_key else base))
            segments.append(Segment(" ", base))
        return segments

    def _row_segments(self, index: int, styles: _PaintStyles) -> list[Segment]:
        row = self.shown_rows[index]
        base = styles.base
        if isinstance(row, GroupRow):
            if index == self.cursor and self.has_focus:
                base = base + styles.cursor
            level = "bad" if row.marks else ""
            return [Segment(" ", base),
                    Segment(group_line(row, _LINE_WIDTH - 1), base + styles.levels[level] if level else base)]
        if row.desynced:
            base = base + styles.desync
        if row.rank in self.selected:
            base = base + styles.selected
        if index == self.cursor and self.has_focus:
            base = base + styles.cursor
        levels = styles.levels
        # The selection needs a non-colour sign too: '*' in the first cell.
        segments = [Segment("*" if row.rank in self.selected else " ", base)]
        shown = cells(row)
        told = self.story.get(row.rank)
        if told:  # the story's word first: CAUSE, or whom this rank waits for
            flags, _ = shown[_FLAGS]
            shown[_FLAGS] = (told + ("" if flags == "✓" else " " + flags), "bad" if told == CAUSE else "warn")
        for (text, level), col in zip(shown, COLUMNS, strict=True):
            text = text if len(text) <= col.width else text[: col.width - 1] + "…"
            text = text.rjust(col.width) if col.right else text.ljust(col.width)
            style: Style = base + levels[level] if level else base
            segments.append(Segment(text, style))
            segments.append(Segment(" ", base))
        return segments
