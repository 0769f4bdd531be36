"""The per-rank sets and counters the row index (:mod:`ddptop.tui.row_index`) keeps up to date
from the ranks that changed: each helper moves one rank from its old value to its new one, and
drops what became empty, so a count or a membership never needs a pass over every rank."""

from __future__ import annotations

from collections import Counter
from typing import Any


def decrement(counts: Counter[Any], key: Any) -> None:
    """One fewer of *key*; a count that reaches zero is dropped (a Counter's ``most_common``
    and its keys then name only what is there)."""
    counts[key] -= 1
    if not counts[key]:
        del counts[key]


def majority(counts: Counter[int]) -> int | None:
    top = counts.most_common(2)
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def set_value(values: dict[int, int] | dict[int, float], rank: int, value: float | None) -> None:
    if value is None:
        values.pop(rank, None)
    else:
        values[rank] = value  # type: ignore[assignment]


def flag(members: set[int], rank: int, on: bool) -> None:
    if on:
        members.add(rank)
    else:
        members.discard(rank)


def move(of: dict[int, int], counts: Counter[int], ranks: dict[int, set[int]], rank: int,
          value: int | None) -> None:
    before = of.pop(rank, None)
    if before is not None:
        decrement(counts, before)
        ranks[before].discard(rank)
        if not ranks[before]:
            del ranks[before]
    if value is not None:
        of[rank] = value
        counts[value] += 1
        ranks.setdefault(value, set()).add(rank)


OpKey = tuple[tuple[str, int], str]  # ((group, seq), op name): a seq counts within its group


def count(ops: dict[tuple[str, int], Counter[str]], ranks: dict[OpKey, set[int]], rank: int,
          op: OpKey, delta: int) -> None:
    counts = ops.setdefault(op[0], Counter())
    counts[op[1]] += delta
    if delta > 0:
        ranks.setdefault(op, set()).add(rank)
        return
    if not counts[op[1]]:
        del counts[op[1]]
        if not counts:
            del ops[op[0]]
    members = ranks[op]
    members.discard(rank)
    if not members:
        del ranks[op]


def recount(counts: Counter[str], before: dict[int, str], now: dict[int, str], moved: list[int]) -> None:
    """*counts* of *before*'s words made the counts of *now*'s: only the *moved* ranks (those
    whose word differs, new ones included) are visited."""
    for rank in moved:
        old = before.get(rank)
        if old is not None:
            decrement(counts, old)
        counts[now[rank]] += 1
