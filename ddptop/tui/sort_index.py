"""The rank table sorted by a column at 32,768 ranks, without building 32,768 rows.

``sort_rows`` orders :class:`~ddptop.tui.rows.RankRow` objects: above GROUP_FROM_RANKS that
meant building every rank's row (~15 us each, half a second at 32,768 ranks) whenever the
order was refreshed. :func:`sorted_ranks` reads each rank's value for the column straight from
what the row would be built from (the view's detail and its unmerged pulse, the index's facts
and marks) and orders the rank ids exactly as ``sort_rows`` orders their rows: values present
first (ties by rank), missing values last by rank. The table builds the ~50 rows it paints.
tests/test_row_index.py holds the order equal to ``sort_rows`` over every row, column by column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ddptop.model.job import RankView
from ddptop.protocol import RankState, Sample

if TYPE_CHECKING:
    from ddptop.tui.row_index import RowIndex

Value = Callable[["RowIndex", int, RankView, RankState], Any]


def _sample(view: RankView, base: RankState) -> RankState | Sample:
    # The moving numbers of a row: the pulse's sample when one waits unmerged, else the state.
    pulse = view.pulse
    return pulse.sample if pulse is not None else base


def _gpu_util(view: RankView, base: RankState) -> float | None:
    if base.gpu is None:
        return None
    pulse = view.pulse
    return pulse.sample.gpu_util_percent if pulse is not None else base.gpu.util_percent


def _gpu_mem(view: RankView, base: RankState) -> float | None:
    gpu = base.gpu
    if gpu is None:
        return None
    pulse = view.pulse
    used = pulse.gpu_mem_used_bytes if pulse is not None else gpu.mem_used_bytes
    return used / gpu.mem_total_bytes if used is not None and gpu.mem_total_bytes else None


def _pending(index: RowIndex, rank: int) -> float | None:
    op = index.facts(rank).op
    return op.age_s if op is not None else None


# A row's value for each column of _SORT_KEYS (ddptop.tui.rows), for a rank with a state.
_VALUES: dict[str, Value] = {
    "host": lambda ix, r, v, b: b.host,
    "step": lambda ix, r, v, b: _sample(v, b).step,
    "epoch": lambda ix, r, v, b: _sample(v, b).epoch,
    "batch": lambda ix, r, v, b: _sample(v, b).batch,
    "seq": lambda ix, r, v, b: ix.facts(r).seq,
    "pending": lambda ix, r, v, b: _pending(ix, r),
    "wait": lambda ix, r, v, b: _sample(v, b).data_wait_fraction,
    "ready": lambda ix, r, v, b: _sample(v, b).loader_ready_batches,
    "cpu": lambda ix, r, v, b: _sample(v, b).cpu_percent,
    "rss": lambda ix, r, v, b: _sample(v, b).rss_bytes,
    "gpu": lambda ix, r, v, b: _gpu_util(v, b),
    "gmem": lambda ix, r, v, b: _gpu_mem(v, b),
    "shm": lambda ix, r, v, b: v.pulse.shm_used_bytes if v.pulse is not None else b.shm_used_bytes,
}
# Rows of ranks never heard from hold the defaults: "" for the host, None for every number.
_EMPTY: dict[str, Any] = {"host": ""}


def sorted_ranks(index: RowIndex, ranks: list[int], key: str, reverse: bool) -> list[int]:
    """*ranks* (ascending) in the order ``sort_rows(rows, key, reverse)`` puts their rows."""
    views, statuses = index.model.ranks, index.statuses
    if key == "rank":
        values: list[Any] = list(ranks)
    elif key == "status":
        values = [statuses.get(r, "unknown") for r in ranks]
    elif key == "flags":
        marks = index.marks
        values = [(len(m), ",".join(m)) for m in (marks.get(r, []) for r in ranks)]
    else:
        get, empty = _VALUES[key], _EMPTY.get(key)
        values = []
        for r in ranks:
            view = views.get(r)
            base = view.base if view is not None else None
            values.append(empty if view is None or base is None else get(index, r, view, base))
    present = [(v, r) for v, r in zip(values, ranks, strict=True) if v is not None]
    present.sort(key=lambda vr: vr[0], reverse=reverse)  # stable: ties stay in rank order
    return [r for _, r in present] + [r for v, r in zip(values, ranks, strict=True) if v is None]
