"""The rank table sorted by a column at 32,768 ranks, without building 32,768 rows.

``sort_rows`` (:mod:`ddptop.tui.sort_filter`) orders :class:`~ddptop.tui.rows.RankRow` objects:
above GROUP_FROM_RANKS that meant building every rank's row (~15 us each, half a second at
32,768 ranks) whenever the order was refreshed. :func:`sorted_ranks` reads each rank's value for
the column straight from what the row would be built from (the view's detail and its unmerged
pulse, the index's facts and marks) and orders the rank ids exactly as ``sort_rows`` orders
their rows: values present first (ties by rank), missing values last by rank. The table builds
the ~50 rows it paints. tests/test_row_index.py holds the order equal to ``sort_rows`` over
every row, column by column.

A sort key pressed at 32,768 ranks pays for one pass reading the column (one comprehension per
column, C-level getters) and one sort of positions by value: 6-51 ms a column, against 7-71 ms
for a call per rank and a sort of (value, rank) pairs (bench: every column, min of 5).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress
from operator import attrgetter, not_
from typing import TYPE_CHECKING, Any, Protocol

from ddptop.model.job import JobModel
from ddptop.model.rank_view import RankView

if TYPE_CHECKING:
    from ddptop.diagnosis.desync import RankFacts


class SortedFacts(Protocol):
    """What the sort reads of the table's index (:class:`ddptop.tui.row_index.RowIndex`)."""

    model: JobModel
    statuses: dict[int, str]  # of the index's latest refresh
    marks: dict[int, list[str]]

    @property
    def every_fact(self) -> dict[int, RankFacts]: ...

# Rows of ranks never heard from hold the defaults: "" for the host, None for every number.
_EMPTY: dict[str, Any] = {"host": ""}
# The columns of the index's last refresh (the others read views and facts, which can be newer).
_OF_REFRESH = frozenset(("rank", "status", "flags"))
# The table's columns that are a Sample field (a RankState has the same field).
_SAMPLE_FIELDS = {"step": "step", "epoch": "epoch", "batch": "batch", "wait": "data_wait_fraction",
                  "ready": "loader_ready_batches", "cpu": "cpu_percent", "rss": "rss_bytes"}


def _moving(views: dict[int, RankView], ranks: list[int], name: str) -> list[Any]:
    # A number a pulse carries: the pulse's sample when one waits unmerged, else the state's.
    # One comprehension with a C-level getter, not a call per rank (3x at 32,768 ranks).
    get = attrgetter(name)
    return [None if v is None or v.base is None else get(v.pulse.sample) if v.pulse is not None
            else get(v.base) for v in map(views.get, ranks)]


def _gpu_util(view: RankView | None) -> float | None:
    if view is None or view.base is None or view.base.gpu is None:
        return None
    pulse = view.pulse
    return pulse.sample.gpu_util_percent if pulse is not None else view.base.gpu.util_percent


def _gpu_mem(view: RankView | None) -> float | None:
    if view is None or view.base is None or (gpu := view.base.gpu) is None:
        return None
    pulse = view.pulse
    used = pulse.gpu_mem_used_bytes if pulse is not None else gpu.mem_used_bytes
    return used / gpu.mem_total_bytes if used is not None and gpu.mem_total_bytes else None


def _of_facts(index: SortedFacts, ranks: list[int], read: Callable[[RankFacts], Any]) -> list[Any]:
    # What the index read last (a rank the model got since has no facts yet: no value).
    views, facts = index.model.ranks, index.every_fact
    return [None if (v := views.get(r)) is None or v.base is None or (f := facts.get(r)) is None
            else read(f) for r in ranks]


def _values(index: SortedFacts, ranks: list[int], key: str) -> list[Any]:
    """Each rank's value for column *key*, aligned with *ranks*; None where the row has none."""
    views = index.model.ranks
    if key == "rank":
        return list(ranks)
    if key == "status":
        get_status = index.statuses.get
        return [get_status(r, "unknown") for r in ranks]
    if key == "flags":
        marks = index.marks
        return [(len(m), ",".join(m)) if (m := marks.get(r)) else (0, "") for r in ranks]
    if key == "host":  # rows of ranks never heard from hold "" (every number: None)
        return ["" if v is None or v.base is None else v.base.host for v in map(views.get, ranks)]
    if key in _SAMPLE_FIELDS:
        return _moving(views, ranks, _SAMPLE_FIELDS[key])
    if key == "seq":
        return _of_facts(index, ranks, attrgetter("seq"))
    if key == "pending":
        return _of_facts(index, ranks, lambda f: f.op.age_s if f.op is not None else None)
    if key == "gpu":
        return list(map(_gpu_util, map(views.get, ranks)))
    if key == "gmem":
        return list(map(_gpu_mem, map(views.get, ranks)))
    if key == "shm":
        return [None if v is None or v.base is None else v.pulse.shm_used_bytes if v.pulse is not None
                else v.base.shm_used_bytes for v in map(views.get, ranks)]
    raise KeyError(key)


def sorted_ranks(index: SortedFacts, ranks: list[int], key: str, reverse: bool) -> list[int]:
    """*ranks* (ascending) in the order ``sort_rows(rows, key, reverse)`` puts their rows."""
    values = _values(index, ranks, key)
    words = index.statuses
    if len(words) < len(index.model.ranks) and key not in _OF_REFRESH:
        # Ranks heard since the last refresh: their rows say "unknown" until the next one.
        empty = _EMPTY.get(key)
        values = [v if r in words else empty for v, r in zip(values, ranks, strict=True)]
    has = [v is not None for v in values]
    if all(has):
        present, at = values, ranks
        missing: list[int] = []
    else:
        present, at = list(compress(values, has)), list(compress(ranks, has))
        missing = list(compress(ranks, map(not_, has)))
    # Sort positions by value: stable, so ties stay in rank order either way round.
    order = sorted(range(len(present)), key=present.__getitem__, reverse=reverse)
    return [*map(at.__getitem__, order), *missing]
