"""Long passes over every rank that let a caller's other work go first (the dashboard's UI).

The dashboard diagnoses a big job on a background thread: at 32,768 ranks about a second
of work (the snapshot's merge of every rank's pulse, then the rules). Python runs one thread
at a time, and a thread that wants the interpreter gets it only every switch interval (5 ms),
so a key handled meanwhile took twice as long or more: at 32,768 ranks sort keys of about
20 ms took 67 ms (median) while a diagnosis ran. The snapshot, the engine between its rules,
the memo before each shared result, the rules between their passes, and the long per-rank
loops (histories, rate windows) call :func:`give_way` every :data:`EVERY` ranks; inside
:func:`giving_way` that calls the caller's hook (the dashboard's waits while its UI is busy,
:class:`ddptop.source.Foreground`), elsewhere it does nothing.
With the dashboard's 1 ms switch interval (:mod:`ddptop.tui.app`) such keys took 28.5 ms.
At 32,768 ranks the longest stretch without a chance was ~125 ms (the copy's status index
built anew, now copied: :meth:`~ddptop.model.status_index.StatusIndex.copy_for`) and then
~40 ms (single rules); it is now ~25 ms (the snapshot's assembly, a young collection).

The hook only decides *when* the work goes on, never what it computes: snapshot, histories
and findings are the same with or without it (tests/test_diagnosis_pace.py). Per context
(``contextvars``), like :mod:`ddptop.diagnosis.memo`: a diagnosis on the UI thread never
waits for its own UI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# A check every 256 ranks: at about 8 us a rank (a merge), 2 ms between two chances for the
# UI (a redraw's busy moment is about 10 ms), and a check costs ~0.1 us a rank.
EVERY = 256

_HOOK: ContextVar[Callable[[], None] | None] = ContextVar("ddptop_give_way", default=None)


@contextmanager
def giving_way(hook: Callable[[], None]) -> Iterator[None]:
    """Inside this block, :func:`give_way` calls *hook* (which may block for a while)."""
    token = _HOOK.set(hook)
    try:
        yield
    finally:
        _HOOK.reset(token)


def give_way() -> None:
    """A moment where the pass may pause: calls the hook of :func:`giving_way`, if any."""
    hook = _HOOK.get()
    if hook is not None:
        hook()
