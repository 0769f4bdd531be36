"""The collective divergence after death (catalog F5 post-mortem): who ran other collectives.

Every rank's last words carry its last collectives from a fresh Flight Recorder read; once
the job is over (fewer than two ranks still running), the first seq at which ranks ran
different ops (compared with the op table, :mod:`ddptop.diagnosis.op_semantics`) names the
rank that diverged (the minority), with each side's op and step (``collective_mismatch``).

Ranks that ended outside any op after seq N while the others entered N+1 and waited there
(``_left_early``) are told by how they ended: with status 0 ("exited cleanly") they skipped a
collective or ran out of work (``collective_mismatch``); with another status (``sys.exit``'s
message, when the rank's last words have it) or by a signal, that end is the cause
(``rank_lost``). A rank that died of an exception is the post-mortem's (``rank_lost`` there,
with its traceback). Pure.
"""

from __future__ import annotations

from collections import defaultdict

from ddptop.diagnosis.common import ACTIVE, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.op_semantics import Signature, is_p2p, signature
from ddptop.diagnosis.wait_graph import wait_graph
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.status import Status
from ddptop.textfmt import op_text

SAME_OPS_REMEDY = ("every rank must call the same collectives in the same order: look for a collective "
                   "under a condition that depends on the rank or on its data (a metric all-reduce one "
                   "rank skips, a loop whose length differs per rank: an unseeded split)")


def collective_divergence(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                          config: DiagnosisConfig) -> list[Finding]:
    """The first seq at which ranks' last collectives differ, from their last words."""
    if len([s for s in snapshot.ranks if s.status in ACTIVE]) >= 2:
        return []  # the live collective_mismatch rule judges running ranks by their pending ops
    reported = [s for s in snapshot.ranks if any(g.recent for g in s.collectives)]
    if len(reported) < 2:
        return []
    out: list[Finding] = []
    for pg in sorted({g.pg for s in reported for g in s.collectives if g.recent}):
        by_seq: dict[int, dict[int, PendingOp]] = defaultdict(dict)
        for s in reported:
            for g in s.collectives:
                if g.pg == pg:
                    for op in g.recent:
                        by_seq[op.seq][s.rank] = op
        found = _first_divergence(by_seq)
        if found is not None:
            out.append(_divergence_finding(snapshot, pg, *found))
            break  # the first diverging group is the cause; the others follow from it
        # A rank that ended while blocked in another group's op (a dump written as it hung, a
        # watchdog's abort) did not leave early: it waited, a victim (the wait-for graph's word)
        blocked = set(wait_graph(snapshot, now, config).waits)
        left = _left_early(snapshot, pg, by_seq, blocked)
        if left is not None:
            out.append(left)
            break
    return out


def _left_early(snapshot: JobSnapshot, pg: str, by_seq: dict[int, dict[int, PendingOp]],
                blocked: set[int]) -> Finding | None:
    """Ranks that ended outside any op before a collective their peers entered and died in.

    Same ops at every seq both sides ran, yet some ranks end after seq N while the others
    entered N+1 and never came back. Ended with status 0, they skipped a collective (a skipped
    op of the same shape as the next one shifts them silently) or ran out of work; ended with
    another status or by a signal, that end is why the others wait.
    """
    states = snapshot.by_rank()
    last: dict[int, int] = {}
    for seq in sorted(by_seq):
        for rank in by_seq[seq]:
            last[rank] = seq
    how = {r: words for r in last if r not in blocked and (words := _how_it_left(states[r]))}
    if not how or not set(last) - set(how):
        return None
    top = max(last.values())
    early = sorted(r for r in how if last[r] < top)
    waiting = sorted(r for r in last if last[r] == top and r not in how)
    if not early or not waiting:
        return None
    failed = [r for r in early if states[r].status != Status.EXITED]
    named = failed or early
    step = _step(states, named)
    op = by_seq[top][waiting[0]]
    where = "" if pg == "0" else f" of process group {pg}"
    first = named[0]
    then = (f" after collective #{last[first]}{where} at step {step}, while {ranks_text(waiting)} entered "
            f"#{top} ({op_text(op)}) and waited for {ranks_text(named)} there")
    evidence = [f"rank {r}: last collective #{last[r]} ({op_text(by_seq[last[r]][r])}), "
                f"step {states[r].step}, {how.get(r) or states[r].status}" for r in sorted(last)]
    if failed:
        # where it exited (sys.exit's caller), as its last words tell
        told = [f"rank {r}: {line.strip()}" for r in failed
                for line in states[r].exit_reason.strip().splitlines()[1:3]]
        return Finding(kind="rank_lost", severity="critical", ranks=named, step=step, victims=waiting,
                       title=f"{ranks_text(named)} {how[first]}{then}", evidence=evidence + told,
                       remedy=_LEFT_REMEDY)
    return Finding(
        kind="collective_mismatch", severity="critical", ranks=early, step=step, victims=waiting,
        title=f"{ranks_text(early)} {how[first]}{then}: the ranks ran different numbers of collectives",
        evidence=evidence, remedy=SAME_OPS_REMEDY)


_LEFT_REMEDY = ("the rank ended on its own while its peers waited for it in their next collective: read why "
                "(its message above, its stderr); a rank that must stop should make every rank stop at the "
                "same step (agree on it with a collective), or the others hang until their timeout")


def _how_it_left(s: RankState) -> str:
    """How *s* ended where it ended by itself outside an exception ("" otherwise): "exited
    cleanly" only for status 0; another status with its ``SystemExit`` message; a signal."""
    reason = s.exit_reason.strip()
    if s.status == Status.EXITED:
        return "exited cleanly" if s.exit_code == 0 else "exited (its exit status unknown)"
    if s.status != Status.CRASHED:
        return ""  # stopped from outside, torn down, lost: the post-mortem tells those
    if s.exit_signal:
        return f"died of {s.exit_signal}"
    if s.exit_code and (not reason or reason.startswith("SystemExit(")):
        message = reason.splitlines()[0] if reason else ""
        return f"exited with status {s.exit_code}" + (f": {message}" if message else "")
    return ""


Divergence = tuple[int, list[list[int]], dict[int, PendingOp]]  # seq, sides (smallest first), ops


def _first_divergence(by_seq: dict[int, dict[int, PendingOp]]) -> Divergence | None:
    for seq in sorted(by_seq):
        ops = by_seq[seq]
        sides: dict[Signature, list[int]] = defaultdict(list)
        for rank, op in sorted(ops.items()):
            if is_p2p(op):
                continue  # pairs: a send and its recv differ by design
            sides[signature(op)].append(rank)
        if len(sides) > 1:
            # Smallest side first: the odd one out is the culprit (ties: lowest rank first).
            return seq, sorted(sides.values(), key=lambda ranks: (len(ranks), ranks)), ops
    return None


def _divergence_finding(snapshot: JobSnapshot, pg: str, seq: int, sides: list[list[int]],
                        ops: dict[int, PendingOp]) -> Finding:
    states = snapshot.by_rank()
    odd, rest = sides[0], [r for side in sides[1:] for r in side]
    certain = len(odd) < len(sides[1])
    lines = [f"{ranks_text(side)}: {op_text(ops[side[0]])} (step {_step(states, side)})" for side in sides]
    where = f"seq {seq}" + (f" of process group {pg}" if pg != "0" else "")
    title = (f"{ranks_text(odd)} ran a different collective at {where}: {op_text(ops[odd[0]])}, while "
             f"{ranks_text(rest)} ran {op_text(ops[rest[0]])}")
    if not certain:
        title += " (as many ranks on each side: which one diverged cannot be told)"
    return Finding(kind="collective_mismatch", severity="critical",
                   ranks=odd if certain else sorted(odd + rest), certain=certain,
                   victims=rest if certain else [], title=title,
                   evidence=[f"last collectives from the ranks' last words, at {where}:", *lines],
                   remedy=SAME_OPS_REMEDY, step=_step(states, odd))


def _step(states: dict[int, RankState], ranks: list[int]) -> int:
    return min(states[r].step for r in ranks if r in states) if any(r in states for r in ranks) else 0
