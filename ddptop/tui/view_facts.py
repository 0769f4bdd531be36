"""A rank's :class:`~ddptop.diagnosis.desync.RankFacts` read from its view, as cheaply as it allows.

The row index (:mod:`ddptop.tui.row_index`) takes every rank that changed since the last
redraw: at 32,768 ranks, all of them every second. :func:`facts_of_view` is ``facts_of`` of
the view's state with shortcuts for the usual rank (one process group, at most one op in
flight), and reads a pulse not merged yet (the digest lane) as it is: merging it costs
~25 us, most of a rank's upkeep. :func:`pulse_facts` is the shortest path of all, for a
rank whose new sample is a pulse over the very detail its last facts came from: only the
numbers that move at every sample are read. Both equal ``facts_of(view.state, status)``
(tests/test_row_index.py holds the rows built from them equal to build_rows).
"""

from __future__ import annotations

from ddptop.diagnosis.desync import STUCK_AFTER_S, RankFacts, facts_of, oldest_pending
from ddptop.model.rank_view import RankView


def facts_of_view(view: RankView, status: str) -> RankFacts:
    """``facts_of(view.state, status)``, merging the view's pulse only when an op is in flight."""
    base, pulse = view.base, view.pulse
    if pulse is not None and base is not None and len(base.collectives) == 1 and \
            not base.collectives[0].pending and len(pulse.seqs) == 1 and len(pulse.seq_changed_at) == 1:
        t, changed, last_step = pulse.sample.time, pulse.seq_changed_at[0], pulse.last_step_at
        return RankFacts(status, True, pulse.seqs[0], None, pulse.sample.step, base.batches_per_epoch,
                         bool(changed) and t - changed >= STUCK_AFTER_S,
                         bool(last_step) and t - last_step >= STUCK_AFTER_S)
    state = view.state
    if state is None or len(state.collectives) != 1:
        return facts_of(state, status)
    group = state.collectives[0]
    pending = group.pending
    op = (pending[0] if len(pending) == 1 else oldest_pending(state)) if pending else None
    changed, last_step = group.seq_changed_at, state.last_step_at
    return RankFacts(status, True, group.seq, op, state.step, state.batches_per_epoch,
                     bool(changed) and state.time - changed >= STUCK_AFTER_S,
                     bool(last_step) and state.time - last_step >= STUCK_AFTER_S, group.pg)


def pulse_facts(view: RankView, old: RankFacts, status: str) -> RankFacts | None:
    """The facts of a rank whose view holds a pulse over the same detail (same object) that
    *old* was read from, with the same *status*; None where :func:`facts_of_view` must decide
    (no pulse, an op in flight, not one group). Only step, seq and the two stuck flags can
    differ from *old*: everything else is detail."""
    pulse = view.pulse
    if pulse is None or old.op is not None or old.status != status or len(pulse.seqs) != 1 \
            or len(pulse.seq_changed_at) != 1:
        return None
    sample = pulse.sample
    t, changed, last_step = sample.time, pulse.seq_changed_at[0], pulse.last_step_at
    return RankFacts(status, True, pulse.seqs[0], None, sample.step, old.bpe,
                     bool(changed) and t - changed >= STUCK_AFTER_S,
                     bool(last_step) and t - last_step >= STUCK_AFTER_S)
