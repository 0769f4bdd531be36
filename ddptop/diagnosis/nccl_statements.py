"""What NCCL's watchdog and PyTorch's own checks print about a hang, from torch 1.8 to today.

Four statements, each read wherever it sits on a line (prefixes, glued progress bars):

* the **watchdog timeout**, ``[Rank R] Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=S, OpType=OP, NumelIn=N, NumelOut=M, Timeout(ms)=T) ran for X
  milliseconds before timing out.`` (no SeqNum before 1.10, no Numel before 2.0, ``[PG ID 2
  PG GUID 3(TP) Rank R]`` since 2.4). ``R`` is the rank *within that process group*: the
  global rank only in the default group;
* **how far the rank got**, ``Timeout at NCCL work: S, last enqueued NCCL work: E, last
  completed NCCL work: C.`` (2.1+; "Exception (either an error or timeout) detected by
  watchdog at work: S, ..." since 2.3): the rank's own word that it completed C;
* PyTorch's **desync report** (TORCH_NCCL_DESYNC_DEBUG): ``[R] Timeout at collective: OP,
  #S``, then "To our best knowledge, the lagging/dead/mismatched ranks that caused the
  desync are: [7] finished collective #182, but didn't join collective #183" / "[1, 2]
  joined but didn't finish collective #183", or "ranks [3] are the lagging ranks that
  caused this timeout. They never joined any collectives", and a snapshot of every rank's
  latest state (torch/csrc/distributed/c10d/TraceUtils.h);
* the **ProcessGroupWrapper's fingerprint check** (TORCH_DISTRIBUTED_DEBUG=DETAIL):
  "Detected mismatch between collectives on ranks. Rank 1 is running collective:
  CollectiveFingerPrint(SequenceNumber=8, OpType=ALLREDUCE, TensorShape=[4], ...), but Rank
  0 is running collective: CollectiveFingerPrint(...)".

Every pattern is linear and bounded; nothing here decides who is to blame. The evidence readers
put the canonical text of each statement in its rank's failure, and the rules read it back
with the same functions (rules_reports).
"""

from __future__ import annotations

import re
from typing import NamedTuple

WATCHDOG = re.compile(
    r"\[(?:(?P<pg>[^\]\[]{0,200}?) )?Rank (?P<grank>\d{1,7})\] ?"
    r"Watchdog caught collective operation timeout: "
    r"WorkNCCL\((?P<body>[^\n]{0,600}?)\) ran for (?P<ran>\d{1,15}) milliseconds")
_FIELD = re.compile(r"(SeqNum|OpType|NumelIn|NumelOut|Timeout\(ms\))=([\w\-]{1,40})")
_PG = re.compile(r"PG (?:ID )?(\w{1,64})(?: PG GUID \w{1,64})?(?:\s?\(([^)]{0,100})\))?")
PROGRESS = re.compile(
    r"(?:\[(?:(?P<pg>[^\]\[]{0,200}?) )?Rank (?P<grank>\d{1,7})\] ?)?(?:Timeout at NCCL work|"
    r"Exception \(either an error or timeout\) detected by watchdog at work): (?P<seq>\d{1,15}), last "
    r"enqueued NCCL work: (?P<enq>-?\d{1,15}), last completed NCCL work: (?P<done>-?\d{1,15})")
ABORTED = "Some NCCL operations have failed or timed out"
_ABORTED = re.compile(r"\[(?:(?P<pg>[^\]\[]{0,200}?) )?Rank (?P<grank>\d{1,7})\] ?"
                      r"Some NCCL operations have failed or timed out")
DESYNC_START = "To our best knowledge"
_DESYNC_AT = re.compile(r"\[(\d{1,7})\] Timeout at collective: (\w{1,40}), #(\d{1,15})")
_FINISHED_NOT_JOINED = re.compile(r"\[([\d, ]{1,4000})\] finished collective #(\d{1,15}), but didn't join")
_JOINED_NOT_FINISHED = re.compile(r"\[([\d, ]{1,4000})\] joined but didn't finish collective #(\d{1,15})")
_NEVER_JOINED = re.compile(r"ranks \[([\d, ]{1,4000})\] are the lagging ranks that caused this timeout")
_LISTED = re.compile(r"\[([\d, ]{1,4000})\] (?:started|finished|joined|are the lagging) ")
_EVERYONE = re.compile(r"report lists ranks \[([\d, -]{1,4000})\]")
FINGERPRINT = "Detected mismatch between collectives on ranks"
_RUNNING = re.compile(r"Rank (\d{1,7}) is running (?:inconsistent )?collective: CollectiveFingerPrint\(")
_FP_FIELD = re.compile(r"(SequenceNumber|OpType|TensorShape|TensorDtypes)=(\[[^\]]{0,400}\]|\w{1,40})")


class Timeout(NamedTuple):
    """One watchdog timeout line."""

    group_rank: int
    pg: str  # the group's id as printed ("0"), "" where the line names none (torch < 2.3)
    pg_desc: str  # "default_pg", "TENSOR_MODEL_PARALLEL_GROUP"...
    seq: int | None
    op: str
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_ms: int


class Progress(NamedTuple):
    """A rank's own count of NCCL work: the one that failed, the last enqueued and completed."""

    group_rank: int | None
    pg: str
    seq: int
    enqueued: int
    completed: int


class Desync(NamedTuple):
    """PyTorch's desync report, as one rank printed it (ranks within the reported group)."""

    reporter: int
    op: str
    seq: int
    finished_not_joined: tuple[int, ...]  # finished #S-1 (or #lag), never joined the next
    joined_not_finished: tuple[int, ...]
    never_joined: tuple[int, ...]
    lag_seq: int | None
    everyone: tuple[int, ...] = ()  # every rank the report lists (its group: each rank is in it once)


class Fingerprint(NamedTuple):
    """Two ranks' collectives as the ProcessGroupWrapper saw them disagree."""

    rank: int
    mine: str  # "SequenceNumber=8, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float"
    other: int
    theirs: str


def timeout_of(text: str) -> Timeout | None:
    """The watchdog timeout in *text*, if it holds one."""
    m = WATCHDOG.search(text)
    if m is None:
        return None
    fields = dict(_FIELD.findall(m.group("body")))
    pg, desc = _group(m.group("pg") or "")
    return Timeout(group_rank=int(m.group("grank")), pg=pg, pg_desc=desc,
                   seq=_int(fields.get("SeqNum")), op=fields.get("OpType", "?"),
                   numel_in=_int(fields.get("NumelIn")), numel_out=_int(fields.get("NumelOut")),
                   timeout_ms=_int(fields.get("Timeout(ms)")), ran_ms=int(m.group("ran")))


def progress_of(text: str) -> Progress | None:
    """The rank's own 'last completed NCCL work' count in *text*, if it holds one."""
    m = PROGRESS.search(text)
    if m is None:
        return None
    pg, _ = _group(m.group("pg") or "")
    grank = m.group("grank")
    return Progress(group_rank=int(grank) if grank else None, pg=pg, seq=int(m.group("seq")),
                    enqueued=int(m.group("enq")), completed=int(m.group("done")))


def desync_of(text: str) -> Desync | None:
    """The desync report in *text* (its lines joined), if it holds one."""
    at = _DESYNC_AT.search(text)
    finished = _FINISHED_NOT_JOINED.search(text)
    joined = _JOINED_NOT_FINISHED.search(text)
    never = _NEVER_JOINED.search(text)
    if not (finished or joined or never):
        return None
    lag = finished or joined
    everyone = sorted({r for m in _LISTED.finditer(text) for r in _ranks(m.group(1))})
    if listed := _EVERYONE.search(text):
        everyone = sorted(set(everyone) | set(_expand(listed.group(1))))
    return Desync(reporter=int(at.group(1)) if at else -1, op=at.group(2) if at else "?",
                  seq=int(at.group(3)) if at else (int(lag.group(2)) if lag else 0),
                  finished_not_joined=_ranks(finished.group(1)) if finished else (),
                  joined_not_finished=_ranks(joined.group(1)) if joined else (),
                  never_joined=_ranks(never.group(1)) if never else (),
                  lag_seq=int(lag.group(2)) if lag else None, everyone=tuple(everyone))


def aborted_rank(text: str) -> tuple[int, str] | None:
    """The group rank (and group) of NCCL's "Some NCCL operations have failed or timed out"
    line in *text*: NCCL took that process down after a collective failed."""
    m = _ABORTED.search(text)
    return (int(m.group("grank")), _group(m.group("pg") or "")[0]) if m else None


def _expand(text: str) -> list[int]:
    """'0-3, 7' -> [0, 1, 2, 3, 7] (bounded)."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (hi.isdigit() or not hi):
            out += range(int(lo), min(int(hi or lo), int(lo) + 65536) + 1)
    return out[:65536]


def fingerprint_of(text: str) -> Fingerprint | None:
    """The two ranks and collectives of a fingerprint mismatch in *text*, if it holds one."""
    if FINGERPRINT not in text:
        return None
    found = [(int(m.group(1)), _balanced(text, m.end())) for m in _RUNNING.finditer(text)]
    if len(found) < 2:
        return None
    (rank, mine), (other, theirs) = found[:2]
    return Fingerprint(rank, _fingerprint_fields(mine), other, _fingerprint_fields(theirs))


_TRACE = re.compile(r"\[Rank (\d{1,7})\] Running collective: CollectiveFingerPrint\(")
TRACE_MARK = "Running collective: CollectiveFingerPrint("
TRACE_LAST = "last traced collective:"


def trace_of(text: str) -> tuple[int, str] | None:
    """The (group) rank and fingerprint fields of a ProcessGroupWrapper trace line
    ("[Rank 1] Running collective: CollectiveFingerPrint(SequenceNumber=3, ...)", logged for
    every collective under TORCH_DISTRIBUTED_DEBUG=DETAIL), if *text* is one."""
    m = _TRACE.search(text)
    return (int(m.group(1)), _fingerprint_fields(_balanced(text, m.end()))) if m else None


def _balanced(text: str, start: int) -> str:
    """The text inside the parenthesis opened just before *start* (nested ones kept; bounded)."""
    depth = 1
    for i in range(start, min(len(text), start + 2000)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return text[start:start + 2000]


def _fingerprint_fields(body: str) -> str:
    """The fields that tell collectives apart, as the fingerprint writes them (device types left out)."""
    return ", ".join(f"{k}={v}" for k, v in _FP_FIELD.findall(body))


def fingerprint_fields(fields: str) -> dict[str, str]:
    """'SequenceNumber=8, OpType=ALLREDUCE, TensorShape=[4]' as a dict."""
    return dict(_FP_FIELD.findall(fields))


def canonical_fingerprint(fp: Fingerprint) -> str:
    """A fingerprint mismatch on one line, without the device options."""
    return (f"{FINGERPRINT}. Rank {fp.rank} is running collective: CollectiveFingerPrint({fp.mine}), but "
            f"Rank {fp.other} is running collective: CollectiveFingerPrint({fp.theirs}).")


def _group(text: str) -> tuple[str, str]:
    m = _PG.search(text)
    if m is None:
        return "", ""
    return m.group(1), m.group(2) or ""


def _ranks(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in re.findall(r"\d{1,7}", text)[:65536])


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


# The canonical one-line forms the evidence readers put in a rank's failure and the
# diagnosis reads back (rules_reports): one format whatever the torch version printed.
def canonical_timeout(t: Timeout) -> str:
    """A watchdog timeout in today's form, its group named where the line named it."""
    group = f"PG ID {t.pg}{f' PG GUID {t.pg}({t.pg_desc})' if t.pg_desc else ''} " if t.pg else ""
    fields = [f"SeqNum={t.seq}" if t.seq is not None else "", f"OpType={t.op}",
              f"NumelIn={t.numel_in}" if t.numel_in is not None else "",
              f"NumelOut={t.numel_out}" if t.numel_out is not None else "",
              f"Timeout(ms)={t.timeout_ms}" if t.timeout_ms is not None else ""]
    body = ", ".join(f for f in fields if f)
    return (f"[{group}Rank {t.group_rank}] Watchdog caught collective operation timeout: WorkNCCL({body}) "
            f"ran for {t.ran_ms} milliseconds before timing out.")


def canonical_desync(d: Desync) -> str:
    """A desync report on one line."""
    parts = [f"[{d.reporter}] Timeout at collective: {d.op}, #{d.seq}", f"{DESYNC_START}:"]
    if d.finished_not_joined and d.lag_seq is not None:
        parts.append(f"[{_list(d.finished_not_joined)}] finished collective #{d.lag_seq}, but didn't join "
                     f"collective #{d.lag_seq + 1}")
    if d.joined_not_finished and d.lag_seq is not None:
        parts.append(f"[{_list(d.joined_not_finished)}] joined but didn't finish collective #{d.lag_seq}")
    if d.never_joined:
        parts.append(f"ranks [{_list(d.never_joined)}] are the lagging ranks that caused this timeout")
    if d.everyone:
        parts.append(f"report lists ranks [{_ranges(d.everyone)}]")
    return "desync report: " + "; ".join(parts)


def _ranges(ranks: tuple[int, ...]) -> str:
    out: list[str] = []
    ordered = sorted(set(ranks))
    start = prev = ordered[0]
    for r in [*ordered[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ", ".join(out)


def _list(ranks: tuple[int, ...]) -> str:
    return ", ".join(str(r) for r in ranks)
