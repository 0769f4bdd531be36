"""Read a training job's console log: which rank failed, when, how, with which exception.

Whatever launched the job (torchrun, torch.distributed.launch, accelerate, deepspeed,
``srun -l``, mpirun) and whichever torch (1.10 to today) wrote it, these parts tell it:

* the ranks' own tracebacks, wherever a prefix proves the rank (``[default1]:[rank1]: ``,
  ``srun -l``'s ``1: ``...: :mod:`ddptop.evidence.log_lines`), the exception's line last;
* what NCCL and PyTorch's checks said (watchdog timeouts, the rank's own count of completed
  work, the desync report, the fingerprint mismatch), each given to the global rank it
  proves (:mod:`ddptop.evidence.log_statements`): carried in the rank's failure message;
* the elastic agent's ``failed (exitcode: C) local_rank: L (pid: P)`` lines;
* torchelastic's summary after a failure (``ChildFailedError``)::

      Root Cause (first observed failure):
      [0]:
        time      : 2026-11-23_23:31:23
        host      : node-3
        rank      : 1 (local_rank: 1)
        exitcode  : -11 (pid: 8827)
        error_file: /tmp/.../attempt_0/1/error.json
        traceback : Signal 11 (SIGSEGV) received by PID 8827

  and the same block for every other failed rank under ``Failures:``.

Lines are capped in length and number; every pattern is linear. :func:`read_log` also
says what of the file it read and what it could not (ranks a line names only within its
process group or node), as notes.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ddptop.diagnosis.claims import Claim
from ddptop.diagnosis.nccl_statements import TRACE_LAST
from ddptop.errortext import innermost
from ddptop.evidence.log_claims import claims_of, recognised
from ddptop.evidence.log_lines import MAX_LOG_BYTES, LogLine, read_lines
from ddptop.evidence.log_statements import Statements, statements
from ddptop.evidence.types import RankFailure

MAX_TRACEBACK_LINES = 200

_FIELD = re.compile(r"^\s{1,8}(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
_RANK = re.compile(r"^(\d{1,7})")
_EXIT = re.compile(r"^(-?\d{1,4})\s*\(pid: (\d{1,9})\)")
_SIGNAL = re.compile(r"Signal (\d{1,3}) \((SIG[A-Z0-9]{2,8})\)")
_SUMMARY_START = ("Root Cause (first observed failure):", "Failures:")


_MARKS = (b"torch/distributed/", b"torch.distributed", b"[rank", b"torchelastic", b"ChildFailedError",
          b"Root Cause (first observed failure)", b"ProcessGroupNCCL", b"ProcessGroupGloo",
          b"Watchdog caught", b"CollectiveFingerPrint", b"local_rank:", b"NCCL WARN", b"NCCL INFO", b"c10d",
          b"Traceback (most recent call last)", b"DataLoader worker", b"gloo::", b"enforce fail at")


def looks_like_torchrun_log(head: bytes) -> bool:
    """True if these bytes (a file's first, or last) look like a training job's console: torchrun's
    own lines, rank prefixes, NCCL's or gloo's, the elastic agent's."""
    return b"\x00" not in head and any(mark in head for mark in _MARKS)


def read_torchrun_log(path: str | os.PathLike[str]) -> list[RankFailure]:
    """Every rank failure the log tells of, the summary's facts joined to the ranks' tracebacks."""
    return read_log(path)[0]


@dataclass
class ConsoleLog:
    """What one console log told: the ranks' failures, its claims, and notes on what was read."""

    failures: list[RankFailure]
    notes: list[str]
    claims: list[Claim]


def read_log(path: str | os.PathLike[str]) -> tuple[list[RankFailure], list[str]]:
    """:func:`read_torchrun_log`, and notes: what of the file was read and what was not."""
    log = read_console_log(path)
    return log.failures, log.notes


def read_console_log(path: str | os.PathLike[str]) -> ConsoleLog:
    """Every failure, claim and note of the log at *path* (EvidenceError if it cannot be read)."""
    p = Path(path)
    lines, cut = read_lines(p)
    texts = [ln.text for ln in lines]
    tracebacks = _rank_tracebacks(lines)
    summary = _attribute_terminate(_summary(texts, str(p)), texts)
    out: dict[int, RankFailure] = {f.rank: f for f in summary}
    said = statements(lines)
    for rank, tb in tracebacks.items():
        message = _exception_line(tb)
        known = out.get(rank)
        if known is None:
            out[rank] = RankFailure(rank=rank, source=str(p), message=message,
                                    traceback=tb[-MAX_TRACEBACK_LINES:])
        else:
            out[rank] = msgspec.structs.replace(known, message=message or known.message,
                                                traceback=tb[-MAX_TRACEBACK_LINES:] or known.traceback)
    notes = _local_exits(out, said, str(p))
    for rank, words in said.by_rank.items():
        known = out.get(rank)
        if known is None:
            traced_only = all(w.startswith(TRACE_LAST) for w in words)
            out[rank] = RankFailure(rank=rank, source=str(p), message="\n".join(words),
                                    failed=not traced_only)
        else:  # the exception's own line first (the cause a person reads), then what NCCL said
            extra = [w for w in words if w not in known.message]
            message = "\n".join([known.message, *extra]) if known.message and "Watchdog caught" not in \
                known.message else "\n".join(words) if not known.message else known.message
            out[rank] = msgspec.structs.replace(known, message=message)
    notes += said.notes
    if cut:
        notes.append(f"{p}: longer than {MAX_LOG_BYTES >> 20} MiB: only its end was read")
    read = list(dict.fromkeys(said.read))
    claims = _with_pids(claims_of(lines, default_group_only=not said.several_groups), out)
    if not out and not any(c.culprits or c.victims or c.named for c in claims) and any(ln.text.strip()
                                                                                      for ln in lines):
        notes.append(f"{p}: read as a training job's console, but no line in it says which rank wrote it "
                     "(no [rankN]: prefix, torchrun summary or NCCL rank): nothing can be attributed to a "
                     "rank; `torchrun --tee 3` or `srun -l` label each line")
    notes.insert(0, f"{p}: {recognised(lines, claims, tracebacks, read, len(summary))}")
    return ConsoleLog([out[r] for r in sorted(out) if r >= 0], notes, claims)


def _with_pids(claims: list[Claim], failures: dict[int, RankFailure]) -> list[Claim]:
    """The OOM killer names a pid: the rank whose failure has that pid is the one it killed."""
    by_pid = {f"pid {f.pid}": rank for rank, f in failures.items() if f.pid}
    return [msgspec.structs.replace(c, culprits=[by_pid[c.place]],
                                    source=f"{c.source}, pid of rank {by_pid[c.place]}")
            if c.kind == "oom_killer" and c.place in by_pid else c for c in claims]


def _local_exits(out: dict[int, RankFailure], said: Statements, source: str) -> list[str]:
    """torchrun's 'failed (exitcode: C) local_rank: L (pid: P)' lines: joined to the summary's
    rank of the same pid; else, on a log that shows one node, local rank L is rank L."""
    notes: list[str] = []
    pids = {f.pid for f in out.values() if f.pid}
    for local, (code, pid) in sorted(said.local_exits.items()):
        if pid in pids:
            continue
        sig = ""
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = ""
        if not said.local_is_global:
            notes.append(f"{source}: torchrun says local rank {local} (pid {pid}) failed with exit code "
                         f"{code}; the log shows several nodes, not which one: its global rank is not named")
            continue
        known = out.get(local)
        failure = RankFailure(rank=local, source=source, pid=pid, exit_code=None if sig else code, signal=sig,
                              message=known.message if known else (f"died of {sig}" if sig else
                                                                   f"exited with code {code}"))
        out[local] = _merged_local(known, failure) if known else failure
    return notes


def _merged_local(known: RankFailure, failure: RankFailure) -> RankFailure:
    code = known.exit_code if known.exit_code is not None else failure.exit_code
    return msgspec.structs.replace(known, pid=known.pid or failure.pid, exit_code=code,
                                   signal=known.signal or failure.signal)


_WHAT = re.compile(r"^\s{0,8}what\(\):\s+(.{1,1000})$")


def _attribute_terminate(failures: list[RankFailure], lines: list[str]) -> list[RankFailure]:
    """C++'s ``terminate called ... what(): ...`` carries no rank: give it to the one rank
    torchrun says died of SIGABRT, when exactly one did (else it names no rank: left out)."""
    said = [m.group(1).strip() for line in lines if (m := _WHAT.match(line))]
    aborted = [i for i, f in enumerate(failures) if f.signal == "SIGABRT"]
    if not said or len(aborted) != 1:
        return failures
    out = list(failures)
    message = _enforce_text(said[-1])
    out[aborted[0]] = msgspec.structs.replace(out[aborted[0]], message=message)
    return out


def _enforce_text(text: str) -> str:
    # "[enforce fail at .../pair.cc:446] op.preamble.length <= op.nbytes. 1092 vs 4": the check, not the path
    return re.sub(r"^\[enforce fail at [^\]]{0,300}\]\s*", "gloo enforce failed: ", text)[:400]


def _rank_tracebacks(lines: list[LogLine]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in lines:
        if line.rank is not None:
            out.setdefault(line.rank, []).append(line.text)
    # A traceback, or an excerpt of one that kept its exception's line (the header was cut off).
    return {rank: tb for rank, tb in out.items()
            if any(ln.startswith("Traceback") or _RAISED.match(ln) for ln in tb)}


_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]{0,120}(?:Error|Exception|Interrupt|Exit|NotMet)\b:? ?.{0,2000}"
                     r"|ERROR: Unexpected bus error encountered in worker.{0,400})$")


def _exception_line(tb: list[str]) -> str:
    """The exception's own line: the innermost error where several are chained or wrapped
    (":func:`ddptop.errortext.innermost`), else the last line naming an exception, else the
    last line that does not belong to a frame (a warning printed after it is not its cause)."""
    raised = [line.strip() for line in tb if _RAISED.match(line.strip()) and not line.startswith(" ")]
    if len(raised) > 1:
        cause = innermost("\n".join(tb))
        if cause.error:
            return cause.text(500)
    if raised:
        return raised[-1][:500]
    for line in reversed(tb):
        text = line.strip()
        if text and not text.startswith(("File ", "^", "~")) and not line.startswith("    "):
            return text[:500]
    return ""


def _summary(lines: list[str], source: str) -> list[RankFailure]:
    out: list[RankFailure] = []
    first = False
    current: dict[str, str] | None = None
    tail: list[str] = []

    def close() -> None:
        if current is not None and "rank" in current:
            out.append(_failure(current, tail, source, first))

    for line in lines:
        stripped = line.strip()
        if stripped in _SUMMARY_START:
            close()
            current, tail = None, []
            first = stripped.startswith("Root Cause")
            continue
        if re.fullmatch(r"\[\d{1,7}\]:", stripped):
            close()
            current, tail = {}, []
            continue
        if current is None:
            continue
        if stripped.startswith(("====", "----")):
            close()
            current, tail = None, []
            continue
        m = _FIELD.match(line)
        if m and m.group(1) not in current:
            current[m.group(1)] = m.group(2).strip()
        elif "traceback" in current and stripped:
            tail.append(stripped)
    close()
    return out


def _failure(fields: dict[str, str], tail: list[str], source: str, first: bool) -> RankFailure:
    rank_m = _RANK.match(fields.get("rank", ""))
    exit_m = _EXIT.match(fields.get("exitcode", ""))
    code = int(exit_m.group(1)) if exit_m else None
    pid = int(exit_m.group(2)) if exit_m else None
    sig = ""
    traceback = fields.get("traceback", "")
    sig_m = _SIGNAL.search(traceback)
    if sig_m:
        sig = sig_m.group(2)
    elif code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = ""
    lines = [traceback, *tail] if traceback and not traceback.startswith("To enable traceback") else tail
    message = _exception_line(lines) if lines else (f"died of {sig}" if sig else "")
    return RankFailure(rank=int(rank_m.group(1)) if rank_m else -1, source=source,
                       host=fields.get("host", ""), pid=pid, time=_when(fields.get("time", "")),
                       message=message,
                       traceback=lines[-MAX_TRACEBACK_LINES:], exit_code=None if sig else code, signal=sig,
                       first=first)


def _when(text: str) -> float:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%d_%H:%M:%S"))
    except ValueError:
        return 0.0
