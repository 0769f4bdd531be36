"""The rank table's rows of one redraw of a big job, built only when painted.

:class:`~ddptop.tui.row_index.RowIndex` hands the table a :class:`RowSequence`: rank ids and
group rows in display order; a rank's row is built (or taken from the index's memo) when the
table paints it, and a group row's counts and ranges are filled then (the table paints about
fifty of 32,768).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Protocol, overload

from ddptop.tui.rows import GroupRow, RankRow
from ddptop.tui.sort_index import SortedFacts, sorted_ranks


class Rows(SortedFacts, Protocol):
    """What the sequence reads of the table's index (:class:`ddptop.tui.row_index.RowIndex`):
    rows built on demand, and what the sort reads."""

    def row(self, rank: int) -> RankRow: ...

    def filled(self, group: GroupRow) -> GroupRow: ...

    def known(self) -> list[int]: ...

Shown = RankRow | GroupRow


class RowSequence(Sequence[Shown]):
    """The table's rows of one redraw, built on demand (the table paints ~50 of 32,768)."""

    def __init__(self, index: Rows, entries: Sequence[int | GroupRow], by_rank: bool,
                 groups: bool = True) -> None:
        self._index = index
        self._entries = entries
        self._by_rank = by_rank  # entries are rank ids in ascending order
        # (kind, *key) -> where that group row is, found when first asked; none where *entries*
        # hold no group (by rank, sorted): looking through 32,768 rank ids cost a sort key 5-15 ms.
        self._groups: dict[tuple[str, ...], int] | None = None if groups and not by_rank else {}

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> Shown: ...
    @overload
    def __getitem__(self, i: slice) -> list[Shown]: ...
    def __getitem__(self, i: int | slice) -> Shown | list[Shown]:
        if isinstance(i, slice):
            return [self._shown(e) for e in self._entries[i]]
        return self._shown(self._entries[i])

    def __iter__(self) -> Iterator[Shown]:
        return (self._shown(e) for e in self._entries)

    def _shown(self, entry: int | GroupRow) -> Shown:
        if isinstance(entry, GroupRow):
            return self._index.filled(entry)
        return self._index.row(entry)

    def index_of(self, rank: int) -> int | None:
        """Where *rank*'s own row is (None when it is inside a folded group)."""
        entries = self._entries
        if self._by_rank:
            i = bisect_left(entries, rank)  # type: ignore[type-var]  # ints only in this view
            return i if i < len(entries) and entries[i] == rank else None
        try:
            return list.index(entries, rank)  # type: ignore[arg-type]  # C-level; groups compare by identity
        except ValueError:
            return None

    def sorted(self, key: str, reverse: bool) -> RowSequence:
        """Every rank's row ordered by column *key* as ``sort_rows`` orders them (built when painted)."""
        return RowSequence(self._index, sorted_ranks(self._index, self._index.known(), key, reverse), False,
                           groups=False)

    def index_of_group(self, key: tuple[str, ...]) -> int | None:
        """Where the group row ``(kind, *key)`` is."""
        if self._groups is None:
            self._groups = {(g.kind, *g.key): i for i, g in enumerate(self._entries)
                            if isinstance(g, GroupRow)}
        return self._groups.get(key)
