"""collective_mismatch on live states (catalog F2, F3): ranks pending at one seq with different calls.

Reads each rank's process groups: the pending ops the reporter took from the Flight
Recorder once the group stopped advancing. A mismatch is certain whatever its age. Who
waits for whom (a stall) is the wait-for graph's (:mod:`ddptop.diagnosis.rules_waits`);
dumped collectives are compared by :mod:`ddptop.diagnosis.rules_wavefront`.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from ddptop.diagnosis.common import active, fresh_ranks, group, human_duration, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.memo import shared
from ddptop.diagnosis.op_semantics import Signature, signer
from ddptop.diagnosis.rules_waits import with_waiters
from ddptop.diagnosis.rules_wavefront import applies as wavefront_applies
from ddptop.model.pace import give_way
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.textfmt import op_tensors, op_text

_UNKNOWN_OP = "collective"  # op name when only the seq (no Flight Recorder entry) shows the wait

DID_NOT_REPORT = "did not report"  # a rank of the job this viewer has no state of


class _Entry(NamedTuple):  # a tuple: thousands per diagnosis in a hang, a frozen dataclass cost 4x
    rank: int
    op: PendingOp
    age: float
    key: Signature  # signature(op), made once: in a hang every rank has one, compared several times


def _pending_by_seq(states: list[RankState], pg: str, now: float) -> dict[int, list[_Entry]]:
    """The pending ops of *pg* by seq, in *states* order; once per diagnosis (both rules ask)."""
    return shared("pending_by_seq", (states,), (pg, now), lambda: _collect_pending(states, pg, now))


def _collect_pending(states: list[RankState], pg: str, now: float) -> dict[int, list[_Entry]]:
    out: dict[int, list[_Entry]] = {}
    sign = signer()  # the op table looked up once per op name: this runs for every rank in a hang
    for s in states:
        g = group(s, pg)
        if g is None or not g.pending:
            continue
        since_sample = max(0.0, now - s.time)
        for op in g.pending:
            key = sign(op)
            if key is None:
                continue  # a send and its recv differ by design: pairs, not a collective
            age = op.age_s + since_sample if s.time else op.age_s  # op_age inline: every rank in a hang
            out.setdefault(op.seq, []).append(_Entry(s.rank, op, age, key))
    return out


def _group_names(states: list[RankState]) -> list[str]:
    return sorted({g.pg for s in states for g in s.collectives})


def _considered(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> list[RankState]:
    # Once per diagnosis: both rules judge the same ranks (and _pending_by_seq is keyed on the list).
    return shared("considered", (snapshot,), (now, config), lambda: _not_restarted(snapshot, now, config))


def _not_restarted(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> list[RankState]:
    # A rank that just restarted counts its collectives from 0 again: its seq and
    # pending ops cannot be compared with its peers' until they restart too.
    fresh = fresh_ranks(snapshot, now, config)
    low = min((s.restart_count for s in active(snapshot)), default=0)
    return [s for s in active(snapshot) if not (s.rank in fresh and s.restart_count > low)]


def collective_mismatch(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                        config: DiagnosisConfig) -> list[Finding]:
    """Ranks pending at the same group and seq with a different op or different sizes."""
    if wavefront_applies(snapshot):
        return []  # dumped collectives with their groups' members: the wavefront rule judges them
    states = _considered(snapshot, now, config)
    out: list[Finding] = []
    for pg in _group_names(states):
        give_way()  # a pass over every rank per group (model.pace)
        for seq, entries in sorted(_pending_by_seq(states, pg, now).items()):
            kinds = Counter(e.key for e in entries)
            if len(entries) < 2 or len(kinds) < 2:
                continue
            (major, most), (_, second) = kinds.most_common(2)
            oldest = max(e.age for e in entries)
            # Peers not heard from yet (in the group, no pending op at this seq) could still
            # join either side: the smaller side is named once no late peer can change which
            # it is, or once the wait is old enough that they are not coming (seen in CI: two of
            # four ranks pending, one per side, named the wrong one by insertion order).
            unheard = _unheard(states, pg, seq, entries)
            settled = most > second + unheard
            if not settled and unheard and oldest < config.stall_s:
                continue
            sides: dict[Signature, list[_Entry]] = {}
            for e in entries:
                sides.setdefault(e.key, []).append(e)
            parts = [f"{ranks_text(e.rank for e in es)} in {es[0].op.op} #{seq}"
                     + (f" {op_tensors(es[0].op.sizes, es[0].op.dtype)}" if es[0].op.sizes else "")
                     for _, es in sorted(sides.items(), key=lambda kv: kv[0] != major)]
            odd = sorted(e.rank for e in entries if e.key != major)
            caveat = ""
            if most == second and not unheard:
                caveat = " (as many ranks on each side: which one diverged cannot be told)"
            elif not settled:
                caveat = f" ({unheard} of the group not heard from: which side diverged is not certain)"
            certain = not caveat
            majority = sorted(e.rank for e in entries if e.key == major)
            out.append(with_waiters(Finding(
                kind="collective_mismatch", severity="critical",
                ranks=odd if certain else sorted(e.rank for e in entries), certain=certain,
                victims=majority if certain else [],
                title=f"collective mismatch in group {pg} at #{seq}: " + "; ".join(parts) + caveat,
                evidence=[*_waiting_lines(entries, seq),
                          f"these ranks entered collective #{seq} with different calls: it can never complete"
                          f" (oldest waits {human_duration(oldest)})"],
                remedy=("the ranks took different code paths: usually one rank ran out of batches first "
                        "(unequal dataset split) and went on to save/evaluate; give every rank the same "
                        "number of batches (seeded split, DistributedSampler) and guard rank-dependent "
                        "collectives"),
                since=now - oldest,
            ), snapshot, now, config))  # the ranks blocked on them (other groups) are victims too
    return out


def _waiting_lines(entries: list[_Entry], seq: int) -> list[str]:
    """'rank 3: all_reduce [64] float32 #12, waiting 40s' per entry, by rank.

    A desync at 32,768 ranks has a line per rank, and the ops and ages repeat: each distinct
    op's text (a function of its name, sizes and dtype) and each age's words are made once.
    """
    ops: dict[tuple[Signature, str], str] = {}
    ages: dict[float, str] = {}
    lines: list[str] = []
    for e in sorted(entries, key=lambda e: e.rank):
        what = ops.get((e.key, e.op.dtype))
        if what is None:
            what = ops[(e.key, e.op.dtype)] = op_text(e.op)
        waited = ages.get(e.age)
        if waited is None:
            waited = ages[e.age] = human_duration(e.age)
        lines.append(f"rank {e.rank}: {what} #{seq}, waiting {waited}")
    return lines


def _unheard(states: list[RankState], pg: str, seq: int, entries: list[_Entry]) -> int:
    """How many of *pg*'s ranks show no pending op at *seq*: reporting without one, or not reporting."""
    heard = {e.rank for e in entries}
    groups = [g for s in states if (g := group(s, pg)) is not None]
    members = max([len(groups)] + [g.size for g in groups])
    return max(0, members - len(heard))
