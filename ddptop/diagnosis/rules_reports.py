"""What NCCL and PyTorch said about a hang, read with the precision rules (catalog F2, F3, F5).

The ranks' failures carry the canonical text of their watchdog timeouts, their own count of
completed work, PyTorch's desync report and the ProcessGroupWrapper's fingerprint mismatch
(:mod:`ddptop.evidence.log_statements`, :mod:`ddptop.diagnosis.nccl_statements`). Rules:

* **the desync report is the strongest evidence**: PyTorch read every rank's last
  collective from the store. The ranks it names as lagging (never joined, or finished the
  previous one and never joined this one) are the cause; those that joined and wait are
  victims; where *every* rank joined and none finished, no rank is to blame: the
  collective itself (network, NCCL, a GPU) is named;
* **a rank whose own evidence shows it past a seq is never "never reached" it**: its
  watchdog line at a higher seq, its "last completed NCCL work", its dump;
* **two ranks that disagree with no third**: both are named, "cannot tell which"
  (``certain=False``), with what evidence would tell;
* **every rank timed out in the same op**: the collective is named, no rank;
* **missing ranks' evidence is said, never guessed**: a rank with no line and no state is
  listed as unknown, not named.

Ranks' sizes are compared with the op table (:mod:`ddptop.diagnosis.op_semantics`): an
ALLTOALL's per-rank sizes are not a mismatch. Pure: no clock is read, no file opened.
"""

from __future__ import annotations

from collections import defaultdict

from ddptop.diagnosis import nccl_statements as nccl
from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.op_semantics import base_name, sizes_differ_allowed
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample

MISMATCH_REMEDY = ("every rank must run the same collectives with the same sizes in the same order: "
                   "look for a collective inside a loop whose length differs per rank (evaluation data "
                   "not sharded evenly, an unseeded split) or under a rank-dependent condition")
NETWORK_REMEDY = ("no rank is behind: the collective itself did not complete. Check the network and GPUs "
                  "of every node (NCCL_DEBUG=INFO, the kernel log for Xid errors, NCCL_IB_*, "
                  "NCCL_SOCKET_IFNAME), then rerun with a Flight Recorder "
                  "(TORCH_NCCL_TRACE_BUFFER_SIZE=2000) to see each rank's ops")
TELL = ("what would tell: each rank's Flight Recorder dump (TORCH_NCCL_TRACE_BUFFER_SIZE, "
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1), PyTorch's desync report (TORCH_NCCL_DESYNC_DEBUG=1), or the lines "
        "of the other ranks")


def _lines(state: RankState, marker: str) -> list[str]:
    return [ln for ln in state.exit_reason.splitlines() if marker in ln]


def _saying(snapshot: JobSnapshot, marker: str) -> list[RankState]:
    """The ranks whose last words hold *marker*, in the snapshot's order: one C-level test a
    rank (a call per rank cost each of these rules ~10 ms at 32,768 ranks, where none has any)."""
    return [s for s in snapshot.ranks if marker in s.exit_reason]


def desync_report(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                  config: DiagnosisConfig) -> list[Finding]:
    """PyTorch's own desync report: the ranks it names, or the collective when all joined."""
    for s in sorted(_saying(snapshot, nccl.DESYNC_START), key=lambda s: s.rank):
        for line in _lines(s, nccl.DESYNC_START):
            report = nccl.desync_of(line)
            if report is not None:
                return [_desync_finding(snapshot, s, report)]
    return []


def _desync_finding(snapshot: JobSnapshot, s: RankState, d: nccl.Desync) -> Finding:
    said = f"PyTorch's desync report (printed by rank {s.rank})"
    evidence = [f"{said}: rank {d.reporter} timed out in {d.op} #{d.seq}"]
    world = len(d.everyone) or max(snapshot.job.world_size, len(snapshot.ranks))
    if d.never_joined:
        culprits = sorted(d.never_joined)
        evidence.append(f"{ranks_text(culprits)} never joined any collective (the report's words)")
        title = (f"{ranks_text(culprits)} never joined any collective; the others timed out in {d.op} "
                 f"#{d.seq} waiting for them ({said})")
        return _culprits(culprits, title, evidence, world)
    behind = sorted(d.finished_not_joined)
    joined = sorted(d.joined_not_finished)
    lag = d.lag_seq if d.lag_seq is not None else d.seq
    if behind:
        evidence.append(f"{ranks_text(behind)} finished collective #{lag} and never joined #{lag + 1}")
        if joined:
            evidence.append(f"{ranks_text(joined)} joined #{lag} and wait (victims)")
        title = (f"{ranks_text(behind)} finished collective #{lag} and never joined #{lag + 1}, which the "
                 f"other ranks wait in ({said})")
        return _culprits(behind, title, evidence, world)
    if joined and set(joined) >= set(d.everyone or range(world)):
        evidence.append(f"all {len(joined)} ranks joined collective #{lag} and none finished it")
        return Finding(kind="collective_stall", severity="critical", ranks=[], victims=joined,
                       title=(f"every rank joined {d.op} #{lag} and none finished it: no rank is behind, the "
                              f"collective itself never completed (network, NCCL, a GPU) ({said})"),
                       evidence=evidence, remedy=NETWORK_REMEDY)
    evidence.append(f"{ranks_text(joined)} joined collective #{lag} and did not finish it, while the others "
                    "had gone past it")
    return _culprits(joined, f"{ranks_text(joined)} joined collective #{lag} and never finished it while the "
                     f"other ranks went past it ({said})", evidence, world)


def _culprits(ranks: list[int], title: str, evidence: list[str], world: int) -> Finding:
    victims = sorted(set(range(world)) - set(ranks))[:4096]
    return Finding(kind="collective_stall", severity="critical", ranks=ranks, victims=victims, title=title,
                   evidence=evidence,
                   remedy=("look at where the named ranks were (their stacks, their logs): a "
                           "collective skipped under a rank-dependent condition, a slower data path, a crash "
                           "or a hung GPU"))


def fingerprint_mismatch(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                         config: DiagnosisConfig) -> list[Finding]:
    """The ProcessGroupWrapper's check: each rank's collective at one seq, compared with the op table."""
    seen: dict[int, str] = {}
    for s in _saying(snapshot, nccl.FINGERPRINT):
        for line in _lines(s, nccl.FINGERPRINT):
            fp = nccl.fingerprint_of(line)
            if fp is not None:
                seen.setdefault(fp.rank, fp.mine)
                seen.setdefault(fp.other, fp.theirs)
    if len(seen) < 2:
        return _traced(snapshot)
    sides: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for rank, fields in sorted(seen.items()):
        sides[_fingerprint_signature(fields)].append(rank)
    if len(sides) < 2:
        return []
    ordered = sorted(sides.values(), key=lambda side: (len(side), side))
    odd = ordered[0]
    certain = len(odd) < len(ordered[1]) and len(seen) >= 3
    evidence = [f"{ranks_text(side)}: {_fingerprint_text(seen[side[0]])}" for side in ordered]
    evidence.insert(0, "PyTorch's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) compared the ranks' "
                       "collectives before running them:")
    rest = [r for side in ordered[1:] for r in side]
    if certain:
        title = (f"{ranks_text(odd)} called {_fingerprint_text(seen[odd[0]])} while {ranks_text(rest)} "
                 f"called {_fingerprint_text(seen[rest[0]])} (PyTorch's fingerprint check)")
        return [Finding(kind="collective_mismatch", severity="critical", ranks=odd, victims=rest, title=title,
                        evidence=evidence, remedy=MISMATCH_REMEDY)]
    named = sorted(seen)
    calls = " vs ".join(_fingerprint_text(seen[side[0]]) for side in ordered)
    title = (f"{ranks_text(named)} called different collectives ({calls}); with no third rank's word, which "
             "one diverged cannot be told")
    return [Finding(kind="collective_mismatch", severity="critical", ranks=named, certain=False, title=title,
                    evidence=[*evidence, TELL], remedy=MISMATCH_REMEDY)]


def _traced(snapshot: JobSnapshot) -> list[Finding]:
    """Each rank's last collective from the wrapper's DETAIL trace, told as info: a rank one
    collective behind may only have logged later, so the trace alone blames no rank."""
    last: dict[int, str] = {}
    for s in _saying(snapshot, nccl.TRACE_LAST):
        for line in _lines(s, nccl.TRACE_LAST):
            if (trace := nccl.trace_of(line)) is not None:
                last[s.rank] = trace[1]
    seqs = {r: nccl.fingerprint_fields(f).get("SequenceNumber", "") for r, f in last.items()}
    if len(last) < 2 or len(set(seqs.values())) < 2:
        return []
    sides: dict[str, list[int]] = defaultdict(list)
    for rank, fields in sorted(last.items()):
        sides[_fingerprint_text(fields)].append(rank)
    return [Finding(kind="collective_mismatch", severity="info", ranks=sorted(last), certain=False,
                    title=("the ranks' last traced collectives differ (TORCH_DISTRIBUTED_DEBUG=DETAIL): "
                           + "; ".join(f"{ranks_text(side)} at {what}" for what, side in sides.items())),
                    evidence=["the trace is logged as each rank starts a collective: a rank behind may be "
                              "the one the others wait for, or only slower to log", TELL],
                    remedy=MISMATCH_REMEDY)]


def _fingerprint_signature(fields: str) -> tuple[str, str, str]:
    f = nccl.fingerprint_fields(fields)
    op = base_name(f.get("OpType", "?"))
    shape = "" if sizes_differ_allowed(op) else f.get("TensorShape", "")
    return op, shape, f.get("TensorDtypes", "")


def _fingerprint_text(fields: str) -> str:
    f = nccl.fingerprint_fields(fields)
    parts = [f.get("OpType", "?"), f.get("TensorShape", ""), f.get("TensorDtypes", ""),
             f"#{f['SequenceNumber']}" if "SequenceNumber" in f else ""]
    return " ".join(p for p in parts if p)
