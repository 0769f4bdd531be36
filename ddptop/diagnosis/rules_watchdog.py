"""NCCL's watchdog timeouts of ended ranks: who ran a different op, who is behind, or the op itself.

Each rank's failure carries its watchdog lines in today's form (the evidence readers turn
every torch version's into it) and, where it printed one, its own count of completed work
("last completed NCCL work: C"). Per process group, the rules of
:mod:`ddptop.diagnosis.rules_reports` apply:

* ranks that timed out at one seq in ops the table says cannot meet (a BROADCAST where the
  others ALLREDUCE, sizes an ALLREDUCE demands equal): the minority diverged, with three
  ranks or more; two ranks alone: both, "cannot tell which";
* ranks at a lower seq than the others: behind (the others' own lines show them past it);
  with two ranks alone, "cannot tell which";
* ranks of the job with no timeout at that seq: behind where their own evidence (a dump,
  a ddptop state, their count of completed work) shows them short of it; unknown where
  nothing is known of them: said, not named;
* every rank of the job timed out in the same op: the collective is named, no rank.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from ddptop.diagnosis import nccl_statements as nccl
from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.op_semantics import base_name, sizes_differ_allowed
from ddptop.diagnosis.rules_reports import MISMATCH_REMEDY, NETWORK_REMEDY, TELL
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.textfmt import op_text

BEHIND_REMEDY = ("read where those ranks were (their stacks, `ddptop doctor` on their node): a rank "
                 "that never reaches a collective is stuck before it (data, a slow save, a hung GPU) or "
                 "skipped it")


class _Seen(NamedTuple):
    rank: int
    t: nccl.Timeout


def watchdog_timeout(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig) -> list[Finding]:
    """The first group whose watchdog timeouts tell a story, told with the precision rules."""
    if any(nccl.DESYNC_START in s.exit_reason or nccl.FINGERPRINT in s.exit_reason for s in snapshot.ranks):
        return []  # PyTorch compared every rank's collectives itself: its report tells the story
    by_group: dict[str, dict[int, nccl.Timeout]] = defaultdict(dict)
    completed: dict[int, int] = {}
    for s in snapshot.ranks:
        for line in s.exit_reason.splitlines():
            if (t := nccl.timeout_of(line)) is not None:
                pg = t.pg or "0"
                known = by_group[pg].get(s.rank)
                if known is None or (t.seq or 0) < (known.seq or 0):
                    by_group[pg][s.rank] = t  # the rank's first op that timed out in that group
            elif (p := nccl.progress_of(line)) is not None and (p.pg or "0") == "0":
                completed[s.rank] = max(completed.get(s.rank, -1), p.completed)
    for pg in sorted(by_group, key=lambda g: (g != "0", g)):
        finding = _group_story(snapshot, pg, by_group[pg], completed if pg == "0" else {})
        if finding is not None:
            return [finding]
    return []


def _group_story(snapshot: JobSnapshot, pg: str, timeouts: dict[int, nccl.Timeout],
                 completed: dict[int, int]) -> Finding | None:
    where = "" if pg == "0" else f" of process group {pg}"
    seqs = {r: t.seq for r, t in timeouts.items() if t.seq is not None}
    if seqs and len(set(seqs.values())) > 1:
        return _seq_disagreement(snapshot, where, timeouts, seqs)
    sides: dict[tuple[str, str], list[int]] = defaultdict(list)
    for rank, t in sorted(timeouts.items()):
        sides[_signature(t)].append(rank)
    seq = next(iter(seqs.values()), None)
    at = f" at seq {seq}" if seq is not None else ""
    if len(sides) > 1:
        ordered = sorted(sides.values(), key=lambda side: (len(side), side))
        odd, rest = ordered[0], [r for side in ordered[1:] for r in side]
        evidence = [f"{ranks_text(side)}: {_what(timeouts[side[0]])}" for side in ordered]
        if len(odd) < len(ordered[1]) and len(timeouts) >= 3:
            title = (f"{ranks_text(odd)} ran {_what(timeouts[odd[0]], short=True)}{at}{where} while "
                     f"{ranks_text(rest)} ran {_what(timeouts[rest[0]], short=True)}: NCCL's watchdog "
                     "aborted them")
            return Finding(kind="collective_mismatch", severity="critical", ranks=odd, victims=rest,
                           title=title, evidence=evidence, remedy=MISMATCH_REMEDY, step=_step(snapshot, odd))
        calls = " vs ".join(_what(timeouts[s[0]], short=True) for s in ordered)
        title = (f"{ranks_text(sorted(timeouts))} timed out{at}{where} in different collectives ({calls}): "
                 "which one diverged cannot be told from these lines")
        return Finding(kind="collective_mismatch", severity="critical", ranks=sorted(timeouts), certain=False,
                       title=title,
                       evidence=[*evidence, TELL], remedy=MISMATCH_REMEDY)
    return _missing(snapshot, pg, where, timeouts, seq, completed)


def _seq_disagreement(snapshot: JobSnapshot, where: str, timeouts: dict[int, nccl.Timeout],
                      seqs: dict[int, int]) -> Finding:
    low = min(seqs.values())
    behind = sorted(r for r, q in seqs.items() if q == low)
    ahead = sorted(r for r, q in seqs.items() if q > low)
    evidence = [f"rank {r}: {_what(timeouts[r])}" for r in sorted(seqs)]
    evidence.append(f"{ranks_text(ahead)} went past seq {low}: their own lines show them at a later "
                    "collective")
    if len(ahead) > len(behind) and len(seqs) >= 3:
        title = (f"{ranks_text(behind)} timed out in {_what(timeouts[behind[0]], short=True)} at seq "
                 f"{low}{where} while {ranks_text(ahead)} had gone on to later collectives: "
                 f"{ranks_text(behind)} fell behind")
        return Finding(kind="collective_stall", severity="critical", ranks=behind, victims=ahead, title=title,
                       evidence=evidence, remedy=BEHIND_REMEDY, step=_step(snapshot, behind))
    both = sorted(seqs)
    return Finding(kind="collective_stall", severity="critical", ranks=both, certain=False,
                   title=(f"{ranks_text(both)} disagree on where they stopped{where} ("
                          + ", ".join(f"rank {r} at seq {seqs[r]}" for r in both)
                          + "): which one is behind cannot be told from these lines (the seqs may also count "
                            "different process groups)"),
                   evidence=[*evidence, TELL], remedy=BEHIND_REMEDY)


def _missing(snapshot: JobSnapshot, pg: str, where: str, timeouts: dict[int, nccl.Timeout], seq: int | None,
             completed: dict[int, int]) -> Finding:
    waited = sorted(timeouts)
    t = timeouts[waited[0]]
    at = f" at seq {seq}" if seq is not None else ""
    states = snapshot.by_rank()
    # The job's size is known from the ranks' own states (a recording, dumps), not from a log's
    # highest rank: with a log alone, ranks beyond those it shows may exist.
    sized = any(s.world_size > 0 for s in snapshot.ranks)
    world = max(snapshot.job.world_size, max(waited) + 1)
    others = sorted(set(range(world)) - set(waited)) if pg == "0" else []
    behind: list[int] = []
    unknown: list[int] = []
    evidence = [f"{ranks_text(waited)}: {_what(t)}"]
    for rank in others:
        line = _short_of(states.get(rank), seq, completed.get(rank))
        if line is None:
            unknown.append(rank)
        else:
            behind.append(rank)
            evidence.append(f"rank {rank}: no watchdog timeout{at}; {line}")
    if not sized:
        unknown.append(-1)  # "the job's other ranks": how many there are is not in this evidence
    if unknown:
        evidence.append(f"{_unknown_text(unknown)}: nothing of them in this evidence: whether they reached "
                        "it is unknown (their logs or Flight Recorder dumps would tell)")
    waits = f"{ranks_text(waited)} waited {t.ran_ms / 1000:.0f} s in {_what(t, short=True)}{at}{where}"
    if behind:
        return Finding(kind="collective_stall", severity="critical", ranks=behind, victims=waited,
                       title=(f"{waits} until NCCL's watchdog aborted them; {ranks_text(behind)} never "
                              "reached it"),
                       evidence=evidence, step=_step(snapshot, behind), remedy=BEHIND_REMEDY)
    if unknown:
        return Finding(kind="collective_stall", severity="critical", ranks=[], victims=waited, certain=False,
                       title=(f"{waits} until NCCL's watchdog aborted them; who they waited for cannot be "
                              f"told: nothing of {_unknown_text(unknown)} is here"),
                       evidence=[*evidence, TELL], remedy=BEHIND_REMEDY)
    return Finding(kind="collective_stall", severity="critical", ranks=[], victims=waited,
                   title=(f"every rank{where} timed out in {_what(t, short=True)}{at} after "
                          f"{t.ran_ms / 1000:.0f} s: no rank is behind, the collective itself never "
                          "completed (network, NCCL, a GPU)"),
                   evidence=evidence, remedy=NETWORK_REMEDY)


def _unknown_text(unknown: list[int]) -> str:
    """'ranks 4-7', or with -1 (a job whose size this evidence does not give) 'the job's other ranks'."""
    known = [r for r in unknown if r >= 0]
    if len(known) == len(unknown):
        return ranks_text(known)
    other = "the job's other ranks (its size is not in this evidence)"
    return f"{ranks_text(known)} or {other}" if known else other


def _short_of(state: RankState | None, seq: int | None, done: int | None) -> str | None:
    """How *state*'s own evidence shows it short of *seq*, or None where it does not."""
    if seq is None:
        return None
    if done is not None and done < seq - 1:
        return f"its own count: last completed NCCL work {done}"
    if state is None:
        return None
    ops = [op for g in state.collectives if g.pg == "0" for op in (*g.recent, *g.pending)]
    last = max(ops, key=lambda op: op.seq) if ops else None
    if last is not None and last.seq < seq:
        return f"its last collective: {op_text(last)}, seq {last.seq}"
    group = next((g for g in state.collectives if g.pg == "0"), None)
    if last is None and group is not None and 0 < group.seq < seq:
        return f"its last collective: seq {group.seq}"
    return None


def _signature(t: nccl.Timeout) -> tuple[str, str]:
    op = base_name(t.op)
    size = "" if sizes_differ_allowed(op) else repr((t.numel_in, t.numel_out))
    return op, size


def _what(t: nccl.Timeout, short: bool = False) -> str:
    size = f" of {t.numel_in} element{'' if t.numel_in == 1 else 's'}" if t.numel_in is not None else ""
    if short:
        return f"{t.op}{size}"
    limit = f" (timeout {t.timeout_ms / 1000:.0f} s)" if t.timeout_ms else ""
    at = f" at seq {t.seq}" if t.seq is not None else ""
    return f"{t.op}{size}{at}, ran {t.ran_ms / 1000:.1f} s{limit}"


def _step(snapshot: JobSnapshot, ranks: list[int]) -> int | None:
    steps = [s.step for s in snapshot.ranks if s.rank in ranks]
    return min(steps) if steps else None
