"""The ranks' own last words about their collectives: gloo's size check, a lost peer's address.

A collective mismatch often ends a job before any viewer sees two ranks in different ops:

* **gloo** checks the size of what a peer sends against what the op expects; when a rank
  receives more, C++ aborts it (SIGABRT) with ``[enforce fail at .../pair.cc:N]
  op.preamble.length <= op.nbytes. 3464 vs 4``: it was in an op of 4 bytes (one float)
  while a peer sent a chunk of 3464. The aborted rank is the one whose op differed, unless
  its peers disagree among themselves. Its last collective is rarely recorded (it died in
  C++ within a second), so its side is told by the size it expected and by where its
  progress page left it (an evaluation loader's extra batch); its peers' side by their last
  Flight Recorder read, in their last words.
* **NCCL**'s watchdog lines, PyTorch's desync report and fingerprint check are read by
  :mod:`ddptop.diagnosis.rules_watchdog` and :mod:`ddptop.diagnosis.rules_reports`.

A victim's "Connection closed by peer [192.0.2.2]:41234" names the address of the rank it
lost: :func:`lost_peers` joins it to the host and ranks the job's store put there.

The text comes from the rank's exit reason: its exception, or the lines of the job's stderr
that the evidence readers gave to it (:mod:`ddptop.evidence.torchrun_log`).
"""

from __future__ import annotations

import re
from collections import defaultdict

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.op_semantics import Signature, signature
from ddptop.model.outcome import PEER_GONE
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.textfmt import op_text

GLOO_SIZE = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d{1,15}) vs (\d{1,15})")
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
    sides: dict[Signature, list[int]] = defaultdict(list)
    for peer, op in sorted(peers.items()):
        sides[signature(op)].append(peer)
    sender = _sender(peers, sides, got, expected)
    if sender is not None:
        return [_sender_finding(states, rank, got, expected, peers, sides, sender)]
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
        were = "was" if len(members) == 1 else "were"
        where = f"; {ranks_text(members)} {were} in {op_text(op)} (seq {op.seq})"
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
                    certain=certain, evidence=evidence, remedy=MISMATCH_REMEDY, step=states[rank].step,
                    since=states[rank].exited_at or None)]


_DTYPE_BYTES = {"float": 4, "float32": 4, "int": 4, "int32": 4, "double": 8, "float64": 8, "long": 8,
                "int64": 8, "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2, "byte": 1,
                "uint8": 1, "char": 1, "int8": 1, "bool": 1}


def _nbytes(op: PendingOp) -> int | None:
    """Bytes of the op's (first) input, where its size and dtype are known."""
    size = _DTYPE_BYTES.get(op.dtype.lower().removeprefix("torch."))
    if size is None or not op.sizes or not op.sizes[0]:
        return None
    n = 1
    for d in op.sizes[0][0]:
        n *= d
    return n * size


def _sender(peers: dict[int, PendingOp], sides: dict[Signature, list[int]], got: int,
            expected: int) -> list[int] | None:
    """The peers whose op carries the *got* bytes that aborted a rank expecting *expected*, where
    the others (with the aborted rank) are in an op of *expected* bytes and outnumber them: the
    sender ran a different collective; the aborted rank is its victim."""
    by_bytes = {sig: _nbytes(peers[ranks[0]]) for sig, ranks in sides.items()}
    senders = [ranks for sig, ranks in sides.items() if by_bytes[sig] == got]
    expecting = [ranks for sig, ranks in sides.items() if by_bytes[sig] == expected]
    if len(senders) != 1 or len(expecting) != 1 or len(senders[0]) >= len(expecting[0]) + 1:
        return None
    return senders[0]


def _sender_finding(states: dict[int, RankState], rank: int, got: int, expected: int,
                    peers: dict[int, PendingOp], sides: dict[Signature, list[int]],
                    sender: list[int]) -> Finding:
    with_rank = [*sorted(r for side in sides.values() if side != sender for r in side), rank]
    theirs, ours = peers[sender[0]], peers[next(r for r in with_rank if r in peers)]
    evidence = [f"{ranks_text(sender)}: last collective {op_text(theirs)}, seq {theirs.seq} ({got} bytes)",
                f"{ranks_text(sorted(with_rank))}: in {op_text(ours)}, seq {ours.seq} ({expected} bytes)",
                f"gloo aborted rank {rank} (SIGABRT) when {ranks_text(sender)}'s {got} bytes arrived where "
                f"its own collective expected {expected} (a victim, not the cause)"]
    return Finding(kind="collective_mismatch", severity="critical", ranks=sender, victims=sorted(with_rank),
                   title=(f"{ranks_text(sender)} ran {op_text(theirs)} as collective #{theirs.seq} while "
                          f"{ranks_text(sorted(with_rank))} ran {op_text(ours)}: gloo aborted rank {rank} "
                          f"when {ranks_text(sender)}'s {got} bytes arrived"),
                   evidence=evidence, remedy=MISMATCH_REMEDY, step=states[sender[0]].step,
                   since=states[rank].exited_at or None)


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
