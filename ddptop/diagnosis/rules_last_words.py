"""The ranks' own last words about their collectives: gloo's size check, NCCL's watchdog.

A collective mismatch often ends a job before any viewer sees two ranks in different ops:

* **gloo** checks the size of what a peer sends against what the op expects; when a rank
  receives more, C++ aborts it (SIGABRT) with ``[enforce fail at .../pair.cc:N]
  op.preamble.length <= op.nbytes. 3464 vs 4``: it was in an op of 4 bytes (one float)
  while a peer sent a chunk of 3464. The aborted rank is the one whose op differed, unless
  its peers disagree among themselves. Its last collective is rarely recorded (it died in
  C++ within a second), so its side is told by the size it expected and by where its
  progress page left it (an evaluation loader's extra batch); its peers' side by their last
  Flight Recorder read, in their last words.
* **NCCL**'s watchdog aborts every rank whose collective ran past the timeout, each with
  ``[Rank R] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=S, OpType=OP,
  NumelIn=N, NumelOut=M, Timeout(ms)=T) ran for X milliseconds before timing out.``
  (ProcessGroupNCCL.cpp). Ranks that timed out at the same seq in different ops ran
  different collectives (``collective_mismatch``, the minority named); ranks of the job that
  did not time out there are the ones the others waited for (``collective_stall``).

A victim's "Connection closed by peer [192.0.2.2]:41234" names the address of the rank it
lost: :func:`lost_peers` joins it to the host and ranks the job's store put there.

The text comes from the rank's exit reason: its exception, or the lines of the job's stderr
that the evidence readers gave to it (:mod:`ddptop.evidence.torchrun_log`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.model.outcome import PEER_GONE
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.textfmt import op_text

GLOO_SIZE = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d{1,15}) vs (\d{1,15})")
WATCHDOG = re.compile(
    r"\[(?:[^\]\[]{0,200} )?Rank (\d{1,7})\] Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(\d{1,15}), OpType=(\w{1,40})(?:, NumelIn=(\d{1,15}), NumelOut=(\d{1,15}))?"
    r"(?:, Timeout\(ms\)=(\d{1,12}))?\) ran for (\d{1,15}) milliseconds")
MISMATCH_REMEDY = ("every rank must run the same collectives with the same sizes in the same order: "
                   "look for a collective inside a loop whose length differs per rank (evaluation data "
                   "not sharded evenly, an unseeded split) or under a rank-dependent condition")


def gloo_size_mismatch(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                       config: DiagnosisConfig) -> list[Finding]:
    """A rank gloo aborted because a peer sent more than its own op expected."""
    states = snapshot.by_rank()
    aborted = {s.rank: (int(m.group(1)), int(m.group(2))) for s in snapshot.ranks
               if (m := GLOO_SIZE.search(s.exit_reason))}
    if not aborted:
        return []
    rank = min(aborted, key=lambda r: (states[r].exited_at or states[r].time, r))
    got, expected = aborted[rank]
    peers = {s.rank: op for s in snapshot.ranks if s.rank not in aborted and (op := _last_op(s)) is not None}
    sides: dict[tuple[str, str], list[int]] = defaultdict(list)
    for peer, op in sorted(peers.items()):
        sides[(op.op, repr(op.sizes))].append(peer)
    extra = _extra_eval_batch(states, rank)
    agree = len(sides) == 1 and len(next(iter(sides.values()))) >= 2
    certain = agree or extra is not None
    culprits = [rank] if certain else sorted({rank, *peers})
    evidence = [f"rank {rank}: gloo aborted it (SIGABRT): a peer sent {got} bytes where its own collective "
                f"expected {expected}" + (f" ({_elements(expected)})" if _elements(expected) else "")]
    where = ""
    if sides:
        members = max(sides.values(), key=len)
        op = peers[members[0]]
        where = f"; {ranks_text(members)} were in {op_text(op)} (seq {op.seq})"
        for side in sides.values():
            last = peers[side[0]]
            evidence.append(f"{ranks_text(side)}: last collective {op_text(last)}, seq {last.seq} "
                            "(their last Flight Recorder read)")
    if extra is not None:
        evidence.append(f"rank {rank} at its death (its progress page): {extra[1]}")
    title = (f"rank {rank} ran a different collective from its peers: its op expected {expected} bytes "
             f"where a peer sent {got}{where}")
    if extra is not None:
        title += f"; rank {rank} was at {extra[0]}"
    if not certain:
        title += " (which side diverged cannot be told from two ranks)"
    return [Finding(kind="collective_mismatch", severity="critical", ranks=culprits, title=title[:400],
                    evidence=evidence, remedy=MISMATCH_REMEDY, step=states[rank].step,
                    since=states[rank].exited_at or None)]


def _extra_eval_batch(states: dict[int, RankState], rank: int) -> tuple[str, str] | None:
    """Where *rank* was in an evaluation loader that its peers have fewer batches of, if it
    was: a short phrase and the whole line."""
    for info in states[rank].loaders:
        if info.role != "eval" or info.length is None:
            continue
        others = {r: other.length for r, s in states.items() if r != rank for other in s.loaders
                  if (other.index, other.name) == (info.index, info.name) and other.length is not None}
        shorter = sorted(r for r, n in others.items() if n is not None and n < info.batch)
        if shorter:
            lengths = sorted({n for r, n in others.items() if r in shorter and n is not None})
            short = (f"batch {info.batch} of evaluation loader #{info.index}, which has {_join(lengths)} "
                     f"batches on {ranks_text(shorter)}")
            return short, (f"batch {info.batch} of {info.length} of evaluation loader #{info.index} "
                           f"{info.name}, which has {_join(lengths)} batches on {ranks_text(shorter)}: "
                           "its extra batch's collective met their next one")
    return None


def _last_op(state: RankState) -> PendingOp | None:
    """A rank's latest collective in the default group: pending, else the last one recorded."""
    ops = [op for g in state.collectives if g.pg == "0" for op in (*g.recent, *g.pending)]
    return max(ops, key=lambda op: op.seq) if ops else None


def _elements(nbytes: int) -> str:
    return "one 4-byte element" if nbytes == 4 else ""


def _join(values: list[int]) -> str:
    return "/".join(str(v) for v in values)


@dataclass(frozen=True)
class _Timeout:
    rank: int
    seq: int
    op: str
    numel: int | None
    timeout_ms: int | None
    ran_ms: int


def watchdog_timeout(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig) -> list[Finding]:
    """NCCL's watchdog timeouts of ended ranks: who ran a different op, who never came."""
    timeouts: dict[int, _Timeout] = {}
    for s in snapshot.ranks:
        found = [_Timeout(int(m.group(1)), int(m.group(2)), m.group(3),
                          int(m.group(4)) if m.group(4) else None, int(m.group(6)) if m.group(6) else None,
                          int(m.group(7))) for m in WATCHDOG.finditer(s.exit_reason)]
        if found:
            timeouts[s.rank] = min(found, key=lambda t: t.seq)  # the first op that timed out
    if not timeouts:
        return []
    seq = min(t.seq for t in timeouts.values())
    at_seq = {r: t for r, t in timeouts.items() if t.seq == seq}
    sides: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    for rank, t in sorted(at_seq.items()):
        sides[(t.op, t.numel)].append(rank)
    evidence = [f"{ranks_text(side)}: {_what(at_seq[side[0]])}" for side in sides.values()]
    if len(sides) > 1:
        ordered = sorted(sides.values(), key=lambda side: (len(side), side))
        odd, rest = ordered[0], [r for side in ordered[1:] for r in side]
        certain = len(odd) < len(ordered[1])
        title = (f"{ranks_text(odd)} ran {_what(at_seq[odd[0]], short=True)} at seq {seq} while "
                 f"{ranks_text(rest)} ran {_what(at_seq[rest[0]], short=True)}: NCCL's watchdog aborted them")
        if not certain:
            title += " (as many ranks on each side: which one diverged cannot be told)"
        return [Finding(kind="collective_mismatch", severity="critical", ranks=odd, title=title,
                        evidence=evidence, remedy=MISMATCH_REMEDY, step=_step(snapshot, odd))]
    world = max(snapshot.job.world_size, len(snapshot.ranks))
    missing = sorted(set(range(world)) - set(at_seq))
    waited = sorted(at_seq)
    t = at_seq[waited[0]]
    if missing:
        for rank in missing:
            state = snapshot.by_rank().get(rank)
            op = _last_op(state) if state is not None else None
            where = f"its last collective: {op_text(op)}, seq {op.seq}" if op is not None else "nothing known"
            evidence.append(f"rank {rank}: no watchdog timeout at seq {seq}; {where}")
        title = (f"{ranks_text(waited)} waited {t.ran_ms / 1000:.0f} s in {_what(t, short=True)} at seq "
                 f"{seq} until NCCL's watchdog aborted them; {ranks_text(missing)} never reached it")
        return [Finding(kind="collective_stall", severity="critical", ranks=missing, title=title,
                        evidence=evidence, step=_step(snapshot, missing),
                        remedy=("read where those ranks were (their stacks, `ddptop doctor` on their node): "
                                "a rank that never reaches a collective is stuck before it or skipped it"))]
    title = (f"every rank timed out in {_what(t, short=True)} at seq {seq} after {t.ran_ms / 1000:.0f} s: "
             "the collective itself never completed (network, NCCL, a GPU)")
    return [Finding(kind="collective_stall", severity="critical", ranks=waited, title=title,
                    evidence=evidence,
                    remedy=("check the network and GPUs of every node (NCCL_DEBUG=INFO, the kernel log: Xid "
                            "errors); then run with a Flight Recorder (TORCH_NCCL_TRACE_BUFFER_SIZE)"))]


def _what(t: _Timeout, short: bool = False) -> str:
    size = f" of {t.numel} element{'' if t.numel == 1 else 's'}" if t.numel is not None else ""
    if short:
        return f"{t.op}{size}"
    limit = f" (timeout {t.timeout_ms / 1000:.0f} s)" if t.timeout_ms else ""
    return f"{t.op}{size} at seq {t.seq}, ran {t.ran_ms / 1000:.1f} s{limit}"


def _step(snapshot: JobSnapshot, ranks: list[int]) -> int | None:
    steps = [s.step for s in snapshot.ranks if s.rank in ranks]
    return min(steps) if steps else None


_PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]{2,45})\]:(\d{1,5})")


def lost_peers(snapshot: JobSnapshot, order: list[RankState]) -> tuple[list[str], dict[int, str]]:
    """Ranks (failed or torn down) whose error names the peer's address ("Connection closed by peer
    [192.0.2.2]:41234"), mapped to the host and ranks the job's store put at that address:
    evidence lines, and each rank so named with its host's words ("host-b (192.0.2.2)")."""
    job = snapshot.job
    at: dict[str, list[int]] = defaultdict(list)
    for rank, address in job.addresses.items():
        at[address].append(rank)
    lines: list[str] = []
    named: dict[int, str] = {}
    for s in order:
        m = _PEER_ADDRESS.search(s.exit_reason) if PEER_GONE.search(s.exit_reason) else None
        own = job.nodes.get(s.rank, s.host)
        ranks = sorted(r for r in at.get(m.group(1), []) if job.nodes.get(r) != own) if m else []
        if not m or not ranks or len(lines) >= 8:
            continue
        host = f"{job.nodes[ranks[0]]} ({m.group(1)})" if ranks[0] in job.nodes else m.group(1)
        named.update((r, host) for r in ranks)
        lines.append(f"rank {s.rank} lost its connection to {m.group(1)}:{m.group(2)}: that is {host}, where "
                     f"{ranks_text(ranks)} ran")
    return lines, named
