"""The rank table's order and filter: sort keys by column, and the filter's query (pure).

Over the rows of :mod:`ddptop.tui.rows`, up to ``GROUP_FROM_RANKS`` ranks; above it the row
index puts rank ids in the same order without building their rows (:mod:`ddptop.tui.sort_index`,
held equal to :func:`sort_rows` by tests/test_row_index.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddptop.tui.rows import RankRow

# What each column sorts by (a column key of rows.COLUMNS); None sorts last.
SORT_KEYS: dict[str, Callable[[RankRow], Any]] = {
    "rank": lambda r: r.rank, "host": lambda r: r.host, "status": lambda r: r.status,
    "flags": lambda r: (len(r.marks), ",".join(r.marks)), "step": lambda r: r.step,
    "epoch": lambda r: r.epoch, "batch": lambda r: r.batch, "seq": lambda r: r.seq,
    "pending": lambda r: r.pending_age_s, "wait": lambda r: r.data_wait, "ready": lambda r: r.ready,
    "cpu": lambda r: r.cpu, "rss": lambda r: r.rss, "gpu": lambda r: r.gpu_util,
    "gmem": lambda r: r.gpu_mem, "shm": lambda r: r.shm_used,
}


def sort_rows(rows: list[RankRow], key: str, reverse: bool = False) -> list[RankRow]:
    """Rows ordered by column *key*; missing values always last, ties by rank."""
    get = SORT_KEYS[key]
    present = [r for r in rows if get(r) is not None]
    missing = [r for r in rows if get(r) is None]
    present.sort(key=lambda r: r.rank)
    present.sort(key=get, reverse=reverse)
    return present + sorted(missing, key=lambda r: r.rank)


def _rank_term(term: str) -> set[int] | None:
    lo, sep, hi = term.partition("-")
    if lo.isdigit() and (not sep or hi.isdigit()):
        return set(range(int(lo), int(hi if sep else lo) + 1))
    return None


def matches(row: RankRow, query: str) -> bool:
    """Does *row* match *query*? Comma-separated terms, any may match: a rank ("3"),
    a rank range ("0-7"), or a case-insensitive piece of the host, status or a mark."""
    terms = [t.strip().lower() for t in query.split(",") if t.strip()]
    if not terms:
        return True
    for term in terms:
        ranks = _rank_term(term)
        if ranks is not None:
            if row.rank in ranks:
                return True
        elif term in row.host.lower() or term in row.status or any(term in m.lower() for m in row.marks):
            return True
    return False


def filter_rows(rows: list[RankRow], query: str) -> list[RankRow]:
    """Rows matching *query* (see :func:`matches`)."""
    if not query.strip():
        return list(rows)  # the usual case, at every redraw: no per-row test
    return [r for r in rows if matches(r, query)]
