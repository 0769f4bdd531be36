"""The wavefront across process groups: who the waiting ranks wait for (catalog F2, F5, dumps).

Input: every rank's groups as a Flight Recorder dump (or a rank's last words) left them,
with the group's members as global ranks (``CollectiveGroup.ranks``), the highest seq the
rank entered, its last ops and those still pending. Per group, the wavefront is the highest
collective any member entered: members that entered it and wait there are *victims*;
members that never entered it are where to look, unless they are themselves waiting in
another group, in which case the blame passes on to whoever that group waits for. The
end of every chain is named: a rank that left no dump, or one that entered no collective
since (it is computing, evaluating, stuck in Python). Ranks that entered the same seq with
a different op, size or dtype are a mismatch; the smaller side is the culprit.

Matching is by ``collective_seq_id`` per group (FR's ``record_id`` is a per-process
counter and means nothing across ranks). Pure: no clock is read, no file is opened.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.memo import shared
from ddptop.diagnosis.op_semantics import Signature, is_p2p, signature
from ddptop.diagnosis.rules_waits import with_waiters
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.textfmt import op_text, rank_ranges

MAX_EVIDENCE = 12
MAX_CHAIN = 64  # groups followed from one rank: a longer chain is a cycle or a broken dump
REMEDY_MISSING = ("look at where the named rank is instead (its stack, its log): a collective skipped "
                  "under a rank-dependent condition, a loop that ran fewer times on it (an unseeded split), "
                  "an exception caught and ignored, or a crash before it could dump")
REMEDY_MISMATCH = ("every rank must call the same collectives in the same order with the same shapes: "
                   "look for a collective under a condition that depends on the rank or on its data")


@dataclass
class _Group:
    """One process group as all the dumps together show it."""

    name: str
    desc: str = ""
    members: set[int] = field(default_factory=set)
    entered: dict[int, int] = field(default_factory=dict)  # rank -> highest seq it entered
    # seq -> rank -> the op it entered as that seq
    ops: dict[int, dict[int, PendingOp]] = field(default_factory=lambda: defaultdict(dict))

    def label(self) -> str:
        desc = f" {self.desc}" if self.desc and self.desc not in ("undefined", "default_pg") else ""
        members = f" (ranks {rank_ranges(self.members)})" if self.members else ""
        return f"group {self.name}{desc}{members}"


@dataclass(frozen=True)
class _Wait:
    """Where a rank is blocked: the newest op it entered and did not complete."""

    group: str
    op: PendingOp


def collective_wavefront(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                         config: DiagnosisConfig) -> list[Finding]:
    """Ranks that entered the same seq of a group with different calls, from their dumped ops."""
    if not applies(snapshot):
        return []
    states = {s.rank: s for s in snapshot.ranks if s.collectives}
    groups = _groups(states.values())
    out: list[Finding] = []
    for g in sorted(groups.values(), key=lambda g: (g.name != "0", g.name)):
        mismatch = _mismatch(g, groups)
        if mismatch is not None:
            out.append(with_waiters(mismatch, snapshot, now, config))
    return out


def applies(snapshot: JobSnapshot) -> bool:
    """True when ranks carry their last ops (dumps, last words, a stalled group's live read):
    then they are compared here, pending or completed, not by the live rule's pending ops.

    Asked by several rules of a diagnosis (a pass over every rank's groups): answered once."""
    return shared("wavefront_applies", (snapshot,), (),
                  lambda: any(g.recent for s in snapshot.ranks for g in s.collectives))


def _groups(states: Iterable[RankState]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for s in states:
        for cg in s.collectives:
            g = out.setdefault(cg.pg, _Group(cg.pg))
            g.desc = g.desc or cg.desc
            g.members |= set(cg.ranks) | {s.rank}
            g.entered[s.rank] = cg.seq
            for op in cg.recent:
                if not is_p2p(op) and op.seq > 0:
                    g.ops[op.seq][s.rank] = op
    return out


def _wait_of(state: RankState) -> _Wait | None:
    pending = [(op.started_at, g.pg, op) for g in state.collectives for op in g.pending]
    if not pending:
        return None
    _, pg, op = max(pending, key=lambda item: (item[0], item[2].seq))
    return _Wait(pg, op)


def _mismatch(g: _Group, groups: dict[str, _Group]) -> Finding | None:
    for seq in sorted(g.ops):
        ops = g.ops[seq]
        sides: dict[Signature, list[int]] = defaultdict(list)
        for rank, op in sorted(ops.items()):
            sides[signature(op)].append(rank)
        if len(sides) < 2:
            continue
        ordered = sorted(sides.values(), key=lambda ranks: (len(ranks), ranks))
        odd, rest = ordered[0], [r for side in ordered[1:] for r in side]
        tie = len(odd) == len(ordered[1])
        told = ""
        if tie and len(sides) == 2:
            # A two-rank tensor-parallel pair cannot outvote itself: its siblings (groups of its
            # size that ran the same op just before) ran the program's op at this seq.
            program = _siblings_op(g, seq, groups)
            if program is not None and program in sides:
                odd = next(side for key, side in sides.items() if key != program)
                rest = sides[program]
                tie = False
                told = f" (as sibling groups ran at #{seq}: {_sibling_names(g, seq, groups, program)})"
        title = (f"{ranks_text(odd)} entered {op_text(ops[odd[0]])} as collective #{seq} of {g.label()}, "
                 f"while {ranks_text(rest)} entered {op_text(ops[rest[0]])}{told}: it can never complete")
        if tie:
            title += " (as many ranks on each side: which one diverged cannot be told)"
        return Finding(kind="collective_mismatch", severity="critical",
                       ranks=sorted(odd + rest) if tie else odd, certain=not tie,
                       victims=[] if tie else rest, title=title,
                       evidence=[f"{ranks_text(side)}: {op_text(ops[side[0]])} #{seq}" for side in ordered],
                       remedy=REMEDY_MISMATCH)
    return None


def _siblings(g: _Group, seq: int, groups: dict[str, _Group]) -> list[_Group]:
    """Groups of *g*'s size, apart from it, whose ranks agree at *seq* and ran *g*'s op at the
    seq before (the other pairs of one tensor-parallel layout, not the data-parallel groups)."""
    before = {signature(op) for op in g.ops.get(seq - 1, {}).values()}
    out = []
    for h in groups.values():
        if h is g or len(h.members) != len(g.members) or h.members & g.members or len(before) != 1:
            continue
        at, prev = h.ops.get(seq, {}), h.ops.get(seq - 1, {})
        if at and prev and {signature(op) for op in prev.values()} == before \
                and len({signature(op) for op in at.values()}) == 1:
            out.append(h)
    return out


def _siblings_op(g: _Group, seq: int, groups: dict[str, _Group]) -> Signature | None:
    votes = {signature(next(iter(h.ops[seq].values()))) for h in _siblings(g, seq, groups)}
    return next(iter(votes)) if len(votes) == 1 else None


def _sibling_names(g: _Group, seq: int, groups: dict[str, _Group], program: Signature) -> str:
    named = [h for h in _siblings(g, seq, groups)
             if signature(next(iter(h.ops[seq].values()))) == program]
    op = next(iter(named[0].ops[seq].values()))
    where = ", ".join(f"group {h.name} (ranks {rank_ranges(h.members)})" for h in named[:3])
    return f"{op_text(op)} in {where}"
