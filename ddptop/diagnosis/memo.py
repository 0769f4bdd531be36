"""Results that several rules derive from the same inputs, computed once per diagnosis.

At 32,768 ranks every pass over the snapshot costs milliseconds, and the rules repeat
some: the active ranks, the fresh ones, the per-host grouping, the rate windows' medians.
:func:`one_diagnosis` opens a memo for the duration of one :func:`~ddptop.diagnosis.engine.diagnose`
call; :func:`shared` answers from it, keyed on the identity of the inputs (alive for the whole
call, so an id cannot be reused meanwhile) and the values that shape the result.

Outside ``one_diagnosis`` (a rule called on its own, as the tests do) nothing is kept:
a rule stays a pure function of its arguments, and inputs changed between two calls can
never be answered from a stale result. The memo is per context (``contextvars``), so the
dashboard's background diagnosis and a diagnosis on the UI thread never share one.
Values handed out are shared between rules: callers must not mutate them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from ddptop.model.pace import give_way

T = TypeVar("T")

_MEMO: ContextVar[dict[Hashable, Any] | None] = ContextVar("ddptop_diagnosis_memo", default=None)


@contextmanager
def one_diagnosis() -> Iterator[None]:
    """Share derived results between the rules run inside this block (one diagnosis)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def shared(name: str, inputs: tuple[object, ...], values: tuple[Hashable, ...],
           compute: Callable[[], T]) -> T:
    """``compute()``, once per diagnosis for the same *inputs* (by identity) and *values*.

    *inputs* are the objects the result is derived from (a snapshot, the histories): they
    are compared by identity, which is cheap and safe while the diagnosis holds them. Their
    references are kept with the result, so an object freed mid-diagnosis cannot lend its
    id to a new one.
    """
    memo = _MEMO.get()
    if memo is None:
        return compute()
    key = (name, tuple(id(x) for x in inputs), values)
    found = memo.get(key)
    if found is not None:
        return found[1]  # type: ignore[no-any-return]
    give_way()  # a derived result is a pass over every rank: the UI may go first (model.pace)
    result = compute()
    memo[key] = (inputs, result)
    return result

