"""Desync marks: which ranks disagree with their peers, and how, as words (never colour alone).

A mark is a short upper-case word shown in the rank table's ``flags`` column and used to
highlight the row. Pure: the model and the clock go in, ``{rank: [mark, ...]}`` comes out.

Lag is judged with each rank's own clock (``state.time - seq_changed_at``): ranks are
sampled at different instants, so a healthy job always shows small seq differences; a
rank only *lags* when it is behind the leader and its own counter has stopped moving.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from ddptop.model.job import JobModel
from ddptop.protocol import PendingOp, RankState

log = logging.getLogger(__name__)

STUCK_AFTER_S = 2.0  # a counter that has not moved for this long (rank's own clock) is stuck

# Mark words. Public: tests and docs/dashboard.md refer to them.
LAG_SEQ, LAG_STEP, MISMATCH, BATCHES = "LAG-SEQ", "LAG-STEP", "MISMATCH", "BATCHES"
STALE, LOST, CRASHED = "STALE", "LOST", "CRASHED"
BAD_STATUS = {"stale": STALE, "lost": LOST, "crashed": CRASHED}


@dataclass(frozen=True)
class JobLeads:
    """Job-wide reference values a rank is compared with."""

    max_seq: int
    max_step: int
    common_bpe: int | None  # the majority's batches_per_epoch; None when there is no majority
    distinct_bpe: int
    ops_at_seq: dict[int, Counter[str]]


def default_group_seq(state: RankState) -> int | None:
    """Sequence number of the default process group ("0", else the first)."""
    if not state.collectives:
        return None
    for group in state.collectives:
        if group.pg == "0":
            return group.seq
    return state.collectives[0].seq


def oldest_pending(state: RankState) -> PendingOp | None:
    """The oldest collective the rank entered and has not completed (default group first)."""
    pending = [op for g in state.collectives for op in g.pending]
    if not pending:
        return None
    return min(pending, key=lambda op: (op.seq, -op.age_s))


def job_leads(states: list[RankState]) -> JobLeads:
    """Leader seq/step, the most common batches_per_epoch, ops entered at each seq."""
    seqs = [s for s in (default_group_seq(st) for st in states) if s is not None]
    bpes = Counter(st.batches_per_epoch for st in states if st.batches_per_epoch is not None)
    ops: dict[int, Counter[str]] = {}
    for st in states:
        op = oldest_pending(st)
        if op is not None:
            ops.setdefault(op.seq, Counter())[op.op] += 1
    return JobLeads(
        max_seq=max(seqs, default=0),
        max_step=max((st.step for st in states), default=0),
        common_bpe=_majority(bpes),
        distinct_bpe=len(bpes),
        ops_at_seq=ops,
    )


def _majority(counts: Counter[int]) -> int | None:
    top = counts.most_common(2)
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def _seq_stuck(state: RankState) -> bool:
    group = next((g for g in state.collectives if g.pg == "0"), None) or (
        state.collectives[0] if state.collectives else None)
    return group is not None and bool(group.seq_changed_at) and \
        state.time - group.seq_changed_at >= STUCK_AFTER_S


def _step_stuck(state: RankState) -> bool:
    return bool(state.last_step_at) and state.time - state.last_step_at >= STUCK_AFTER_S


def marks_for(state: RankState | None, status: str, leads: JobLeads) -> list[str]:
    """The desync marks of one rank (empty when it agrees with its peers)."""
    marks: list[str] = []
    if status in BAD_STATUS:
        marks.append(BAD_STATUS[status])
    if state is None:
        return marks
    seq = default_group_seq(state)
    if seq is not None and seq < leads.max_seq and _seq_stuck(state):
        marks.append(LAG_SEQ)
    if state.step < leads.max_step and _step_stuck(state):
        marks.append(LAG_STEP)
    op = oldest_pending(state)
    if op is not None:
        counts = leads.ops_at_seq.get(op.seq)
        # The minority op at a seq is the odd one out; a tie marks everyone (no majority).
        if counts is not None and len(counts) > 1:
            top = counts.most_common()
            if counts[op.op] < top[0][1] or top[0][1] == top[1][1]:
                marks.append(MISMATCH)
    # Without a majority (all four counts differ) nobody is "the odd one": mark every rank.
    if state.batches_per_epoch is not None and leads.distinct_bpe > 1 and (
            leads.common_bpe is None or state.batches_per_epoch != leads.common_bpe):
        marks.append(BATCHES)
    return marks


def desync_marks(model: JobModel, now: float) -> dict[int, list[str]]:
    """Marks of every rank of *model* at *now*."""
    views = sorted(model.ranks.items())
    states = [v.state for _, v in views if v.state is not None]
    leads = job_leads(states)
    return {rank: marks_for(view.state, view.status(now), leads) for rank, view in views}
