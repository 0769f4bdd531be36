"""Desync marks: which ranks disagree with their peers, and how, as words (never colour alone).

A mark is a short upper-case word shown in the rank table's ``flags`` column and used to
highlight the row. Pure: the model and the clock go in, ``{rank: [mark, ...]}`` comes out.

Lag is judged with each rank's own clock (``state.time - seq_changed_at``): ranks are
sampled at different instants, so a healthy job always shows small seq differences; a
rank only *lags* when it is behind the leader and its own counter has stopped moving.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from ddptop.model.job import JobModel
from ddptop.protocol import PendingOp, RankState

STUCK_AFTER_S = 2.0  # a counter that has not moved for this long (rank's own clock) is stuck

# Mark words. Public: tests and docs/dashboard.md refer to them.
LAG_SEQ, LAG_STEP, MISMATCH, BATCHES = "LAG-SEQ", "LAG-STEP", "MISMATCH", "BATCHES"
STALE, LOST, CRASHED, TORN_DOWN = "STALE", "LOST", "CRASHED", "TORN-DOWN"
BAD_STATUS = {"stale": STALE, "lost": LOST, "crashed": CRASHED, "terminated": CRASHED, "torn_down": TORN_DOWN}


@dataclass(frozen=True)
class JobLeads:
    """Job-wide reference values a rank is compared with."""

    max_seq: int
    max_step: int
    common_bpe: int | None  # the majority's batches_per_epoch; None when there is no majority
    distinct_bpe: int
    # ops entered at each (group, seq): a seq means something only within its group (an MoE
    # rank's tp all_reduce #5 and another's ep all_to_all #5 are not one collective)
    ops_at_seq: dict[tuple[str, int], Counter[str]]


def default_group_seq(state: RankState) -> int | None:
    """Sequence number of the default process group ("0", else the first)."""
    if not state.collectives:
        return None
    for group in state.collectives:
        if group.pg == "0":
            return group.seq
    return state.collectives[0].seq


def oldest_pending_of(state: RankState) -> tuple[str, PendingOp] | None:
    """The group and op of :func:`oldest_pending`."""
    found = [(op.seq, -op.age_s, g.pg, op) for g in state.collectives for op in g.pending]
    if not found:
        return None
    _, _, pg, op = min(found, key=lambda item: (item[0], item[1]))
    return pg, op


def oldest_pending(state: RankState) -> PendingOp | None:
    """The oldest collective the rank entered and has not completed (default group first)."""
    if not any(g.pending for g in state.collectives):
        return None  # the usual case, checked without building a list
    pending = [op for g in state.collectives for op in g.pending]
    return min(pending, key=lambda op: (op.seq, -op.age_s))


class RankFacts(NamedTuple):
    """What the marks of one rank depend on, read once from its state (cacheable per state).

    A NamedTuple, not a frozen dataclass: thousands are made per redraw at 4096 ranks, and
    a frozen dataclass's ``__init__`` costs several times a tuple's.
    """

    status: str
    has_state: bool = False
    seq: int | None = None
    op: PendingOp | None = None
    step: int = 0
    bpe: int | None = None
    seq_stuck: bool = False
    step_stuck: bool = False
    pg: str = ""  # the group of ``op``


def facts_of(state: RankState | None, status: str) -> RankFacts:
    """The :class:`RankFacts` of a rank with *state* (None: never heard from) and *status*."""
    if state is None:
        return RankFacts(status=status)
    # One plain pass over the groups, no generators: the dashboard calls this for every rank
    # that sent a sample since the last redraw (a thousand per redraw at 4096 ranks), and
    # this form costs a third of default_group_seq + oldest_pending + _seq_stuck. Same rules:
    # the default group is pg "0", else the first.
    groups = state.collectives
    default = None
    pending = False
    for group in groups:
        if default is None and group.pg == "0":
            default = group
        if group.pending:
            pending = True
    if default is None and groups:
        default = groups[0]
    if default is None:
        seq, seq_stuck = None, False
    else:
        seq, changed = default.seq, default.seq_changed_at
        seq_stuck = bool(changed) and state.time - changed >= STUCK_AFTER_S
    last_step = state.last_step_at
    step_stuck = bool(last_step) and state.time - last_step >= STUCK_AFTER_S
    oldest = oldest_pending_of(state) if pending else None
    return RankFacts(status, True, seq, oldest[1] if oldest else None, state.step,
                     state.batches_per_epoch, seq_stuck, step_stuck, oldest[0] if oldest else "")


def leads_of(facts: list[RankFacts]) -> JobLeads:
    """Leader seq/step, the most common batches_per_epoch, ops entered at each seq."""
    present = [f for f in facts if f.has_state]
    if not present:
        return JobLeads(max_seq=0, max_step=0, common_bpe=None, distinct_bpe=0, ops_at_seq={})
    # Columns by zip (in C) rather than a generator per field: this runs over every rank at
    # every redraw of the table.
    _, _, seqs, pending, steps, bpe_column, _, _, groups = zip(*present, strict=True)
    bpes = Counter(bpe_column)
    bpes.pop(None, None)
    ops: dict[tuple[str, int], Counter[str]] = {}
    for op, pg in zip(pending, groups, strict=True):
        if op is not None:
            ops.setdefault((pg, op.seq), Counter())[op.op] += 1
    return JobLeads(
        max_seq=max([seq for seq in seqs if seq is not None], default=0),
        max_step=max(steps),
        common_bpe=_majority(bpes),
        distinct_bpe=len(bpes),
        ops_at_seq=ops,
    )


def _majority(counts: Counter[int]) -> int | None:
    top = counts.most_common(2)
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def marks_of(f: RankFacts, leads: JobLeads) -> list[str]:
    """The desync marks of the rank described by *f* (empty when it agrees with its peers)."""
    marks: list[str] = []
    if f.status in BAD_STATUS:
        marks.append(BAD_STATUS[f.status])
    if not f.has_state:
        return marks
    if f.seq is not None and f.seq < leads.max_seq and f.seq_stuck:
        marks.append(LAG_SEQ)
    if f.step < leads.max_step and f.step_stuck:
        marks.append(LAG_STEP)
    if f.op is not None:
        counts = leads.ops_at_seq.get((f.pg, f.op.seq))
        # The minority op at a seq is the odd one out; a tie marks everyone (no majority).
        if counts is not None and len(counts) > 1:
            top = counts.most_common()
            if counts[f.op.op] < top[0][1] or top[0][1] == top[1][1]:
                marks.append(MISMATCH)
    # Without a majority (all four counts differ) nobody is "the odd one": mark every rank.
    if f.bpe is not None and leads.distinct_bpe > 1 and (
            leads.common_bpe is None or f.bpe != leads.common_bpe):
        marks.append(BATCHES)
    return marks


def desync_marks(model: JobModel, now: float) -> dict[int, list[str]]:
    """Marks of every rank of *model* at *now*."""
    facts = {rank: facts_of(view.state, view.status(now)) for rank, view in sorted(model.ranks.items())}
    leads = leads_of(list(facts.values()))
    return {rank: marks_of(f, leads) for rank, f in facts.items()}
