"""Collective rules: collective_mismatch and collective_stall (catalog F2, F3, F5).

Both read each rank's process groups: the sequence number (how many collectives the
rank entered) and the pending ops the reporter took from the Flight Recorder once the
group stopped advancing. A mismatch is certain whatever its age; a stall is judged by
age, and "every rank in the same collective, young" is a legitimately slow save.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from ddptop.diagnosis.common import active, fresh_ranks, group, human_duration, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.memo import shared
from ddptop.diagnosis.op_semantics import Signature, signature, signer
from ddptop.diagnosis.rules_wavefront import applies as wavefront_applies
from ddptop.model.pace import EVERY, give_way
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.status import Status
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
            out.append(Finding(
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
            ))
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


def collective_stall(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig) -> list[Finding]:
    """Ranks waiting in a collective a peer never entered, or every rank stuck in the same one."""
    if wavefront_applies(snapshot):
        return []
    states = _considered(snapshot, now, config)
    if len(states) < 2 and snapshot.job.world_size < 2:
        return []  # a one-rank job has no peer to wait for
    out: list[Finding] = []
    for pg in _group_names(states):
        give_way()  # each of these passes over every rank is ~5 ms at 32,768 (model.pace)
        groups = {s.rank: g for s in states if (g := group(s, pg)) is not None}  # one lookup per rank
        seqs = {rank: g.seq for rank, g in groups.items()}
        give_way()
        top = max(seqs.values(), default=0)
        if top == 0:
            continue  # start-up: no collective entered yet
        pending = _pending_by_seq(states, pg, now).get(top, [])
        if len({e.key for e in pending}) > 1:
            continue  # a mismatch: collective_mismatch explains it
        waiting = {e.rank: e for e in pending}
        # Without Flight Recorder data, a rank at the top seq that has not moved is waiting too.
        for rank, g in groups.items():
            if rank not in waiting and g.seq == top and not g.pending \
                    and g.seq_changed_at and now - g.seq_changed_at >= config.stall_s:
                op = PendingOp(seq=top, op=_UNKNOWN_OP)
                waiting[rank] = _Entry(rank, op, now - g.seq_changed_at, signature(op))
        if not waiting:
            continue
        age = min(e.age for e in waiting.values())
        behind = {r: q for r, q in seqs.items() if q < top}
        gone = {r: st for r, st in _gone_ranks(snapshot).items() if r not in seqs}
        size = max((g.size for g in groups.values()), default=0)
        if pg == "0" or size == snapshot.job.world_size:
            for r in snapshot.job.unreachable:
                gone.setdefault(r, DID_NOT_REPORT)
        op = next(iter(waiting.values())).op
        where = f"{op.op} #{top}" + ("" if pg == "0" else f" (group {pg})")
        if behind or gone:
            finding = _partial_stall(snapshot, pg, where, waiting, behind, gone, age, now, config)
        else:
            finding = _all_stuck(snapshot, where, top, waiting, age, now, config)
        if finding is not None:
            out.append(finding)
    return out


def _gone_ranks(snapshot: JobSnapshot) -> dict[int, str]:
    out: dict[int, str] = {}
    for i, s in enumerate(snapshot.ranks):
        if not i % EVERY:
            give_way()
        if s.status in (Status.LOST, Status.CRASHED, Status.EXITED):
            out[s.rank] = s.status + (f" ({s.exit_reason})" if s.exit_reason else "")
    return out


def _partial_stall(snapshot: JobSnapshot, pg: str, where: str, waiting: dict[int, _Entry],
                   behind: dict[int, int], gone: dict[int, str], age: float, now: float,
                   config: DiagnosisConfig) -> Finding | None:
    if age < config.stall_s:
        return None
    by_rank = snapshot.by_rank()
    lagging = sorted(set(behind) | set(gone))
    # A rank behind whose newest state is older than the wait was not seen outside it: it may
    # have entered since (a silent rank, a lagging sender). Only one heard after can be said
    # to have never entered it.
    began = now - age
    unheard = {r for r in behind if by_rank[r].time < began}
    evidence = [f"{ranks_text(waiting)} have waited {human_duration(age)} in {where}"]
    for r in sorted(behind):
        s = by_rank[r]
        last = f", last step {human_duration(now - s.last_step_at)} ago" if s.last_step_at else ""
        at = f"seq {behind[r]}, step {s.step}{last}"
        evidence.append(f"rank {r} not heard from since it began (last state "
                        f"{human_duration(now - s.time)} ago: {at})" if r in unheard
                        else f"rank {r} never entered it ({at})")
    evidence += [f"rank {r} {why}" for r, why in sorted(gone.items())]
    # Ranks this viewer never heard from at all (no discovery entry here, unreachable): not seen outside
    # the collective either.
    unreported = {r for r, why in gone.items() if why == DID_NOT_REPORT and r not in by_rank}
    never = sorted(set(lagging) - unheard - unreported)
    told = [f"{ranks_text(never)} never entered it"] if never else []
    if unheard:
        told.append(f"{ranks_text(sorted(unheard))} not heard from since it began")
    if unreported:
        told.append(f"{ranks_text(sorted(unreported))} never heard from")
    op = next(iter(waiting.values())).op
    if op.timeout_s:
        evidence.append(f"the watchdog fires after {human_duration(op.timeout_s)}, "
                        f"{human_duration(max(0.0, op.timeout_s - age))} from now")
    critical = age >= config.stall_critical_s or bool(gone) or bool(
        op.timeout_s and age >= op.timeout_s / 2)
    return Finding(
        kind="collective_stall", severity="critical" if critical else "warning", ranks=lagging,
        title=f"{ranks_text(waiting)} have waited {human_duration(age)} in {where}; " + "; ".join(told),
        evidence=evidence,
        remedy=(f"look at what {ranks_text(lagging)} is doing (stacks: press s in `ddptop attach`): a rank "
                "that loads data slowly, ran out of batches, or took another code path; if it is saving a "
                "checkpoint, that is expected for the duration of the save"),
        since=now - age,
    )


def _all_stuck(snapshot: JobSnapshot, where: str, top: int, waiting: dict[int, _Entry],
               age: float, now: float, config: DiagnosisConfig) -> Finding | None:
    first = top <= 1
    limit = config.first_collective_stall_s if first else config.all_stuck_s
    if age < limit or len(waiting) < len(active(snapshot)):
        return None  # a young collective every rank is in: a slow save or a big all-gather
    if any(e.op.op == _UNKNOWN_OP for e in waiting.values()):
        return None  # seq not moving on every rank is idleness (eval, save), not proof of a collective
    evidence = [f"all {len(waiting)} ranks have been inside {where} for {human_duration(age)}"]
    utils = [s.gpu.util_percent for s in active(snapshot) if s.gpu and s.gpu.util_percent is not None]
    if utils:
        evidence.append(f"GPU busy {min(utils):.0f}-{max(utils):.0f}%")
    p2p = sorted({w for s in active(snapshot) if s.gpu for w in s.gpu.p2p.values()})
    if p2p:
        evidence.append("NVML P2P status: " + ", ".join(p2p))
    nccl = snapshot.job.backend == "nccl" or any("nccl" in e.op.op.lower() for e in waiting.values())
    if first:
        evidence.append("no rank completed any collective")
        remedy = ("the first collective never completes: on nccl this is the P2P-transport signature; "
                  "export NCCL_P2P_DISABLE=1 and retry (NCCL_DEBUG=INFO shows the transport chosen)"
                  if nccl else
                  "check the network between the ranks (firewall, interface: GLOO_SOCKET_IFNAME)")
    else:
        remedy = ("every rank is inside the same collective and none completes: check the network and "
                  "NCCL_DEBUG=INFO output; a huge all-gather on a slow link can also take this long")
    critical = age >= config.all_stuck_critical_s or (first and nccl and bool(utils) and min(utils) >= 90)
    return Finding(
        kind="collective_stall", severity="critical" if critical else "warning", ranks=sorted(waiting),
        title=f"all {len(waiting)} ranks stuck in {where} for {human_duration(age)}"
              + (" (the first collective)" if first else ""),
        evidence=evidence, remedy=remedy, since=now - age,
    )
