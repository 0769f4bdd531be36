"""Read torchrun's console log: which rank failed, when, how, with which exception.

Two parts of the log tell it (torch 2.x):

* the ranks' own tracebacks, prefixed ``[default1]:[rank1]: `` (``--tee``/``--redirects``, or
  the default since torch 2.2 for uncaught exceptions), the exception's line last;
* NCCL's watchdog line, ``[rank1]:[E... ProcessGroupNCCL.cpp:N] [Rank 1] Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=..., OpType=..., NumelIn=..., ...) ran for
  ... milliseconds before timing out.``: the op that timed out is that rank's cause;
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

Lines are capped in length and number; every pattern is anchored and linear.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import msgspec

from ddptop.errors import EvidenceError
from ddptop.evidence.types import RankFailure
from ddptop.store.remains import read_bounded

MAX_LOG_BYTES = 64 << 20  # the tail of a longer log is read
MAX_LINE = 4096
MAX_TRACEBACK_LINES = 200

_PREFIXED = re.compile(r"^(?:\[[A-Za-z0-9_]{1,64}\]:)?\[rank(\d{1,7})\]: ?(.*)$")
_FIELD = re.compile(r"^\s{1,8}(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
_RANK = re.compile(r"^(\d{1,7})")
_EXIT = re.compile(r"^(-?\d{1,4})\s*\(pid: (\d{1,9})\)")
_SIGNAL = re.compile(r"Signal (\d{1,3}) \((SIG[A-Z0-9]{2,8})\)")
_SUMMARY_START = ("Root Cause (first observed failure):", "Failures:")


def looks_like_torchrun_log(head: bytes) -> bool:
    """True if the first bytes look like torchrun's output (its own log lines or rank prefixes)."""
    return (b"torch/distributed/" in head or b"[rank" in head or b"torchelastic" in head
            or b"Root Cause (first observed failure)" in head or b"ChildFailedError" in head)


def read_torchrun_log(path: str | os.PathLike[str]) -> list[RankFailure]:
    """Every rank failure the log tells of, the summary's facts joined to the ranks' tracebacks."""
    p = Path(path)
    try:
        data, _size = read_bounded(p, MAX_LOG_BYTES, tail=True)  # a longer log: its end tells
    except OSError as exc:
        raise EvidenceError(f"{p}: cannot read ({exc.strerror or exc})") from None
    lines = [ln[:MAX_LINE] for ln in data.decode("utf-8", "replace").splitlines()]
    tracebacks = _rank_tracebacks(lines)
    summary = _attribute_terminate(_summary(lines, str(p)), lines)
    out: dict[int, RankFailure] = {f.rank: f for f in summary}
    for rank, said in _watchdog_lines(lines).items():
        known = out.get(rank)
        if known is None:
            out[rank] = RankFailure(rank=rank, source=str(p), message=said)
        elif "Watchdog caught" not in known.message:  # the timeout is the cause; "died of SIGABRT" is not
            out[rank] = msgspec.structs.replace(known, message=said)
    for rank, tb in tracebacks.items():
        message = _exception_line(tb)
        known = out.get(rank)
        if known is None:
            out[rank] = RankFailure(rank=rank, source=str(p), message=message,
                                    traceback=tb[-MAX_TRACEBACK_LINES:])
        else:
            out[rank] = RankFailure(rank=rank, source=known.source, host=known.host, pid=known.pid,
                                    time=known.time, message=message or known.message,
                                    traceback=tb[-MAX_TRACEBACK_LINES:] or known.traceback,
                                    exit_code=known.exit_code, signal=known.signal, first=known.first)
    return [out[r] for r in sorted(out)]


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


_WATCHDOG = re.compile(r"\[Rank \d{1,7}\] Watchdog caught collective operation timeout: .{1,600}$")


def _watchdog_lines(lines: list[str]) -> dict[int, str]:
    """NCCL's watchdog line of each rank (its first), without the launcher's prefix: it names
    the op, its seq and size that timed out, and prefixed lines carry the rank."""
    out: dict[int, str] = {}
    for line in lines:
        if "Watchdog caught" not in line:
            continue
        m = _PREFIXED.match(line)
        said = _WATCHDOG.search(line)
        if m and said and int(m.group(1)) not in out:
            out[int(m.group(1))] = said.group(0)[:500]
    return out


def _rank_tracebacks(lines: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in lines:
        m = _PREFIXED.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return {rank: tb for rank, tb in out.items() if any(ln.startswith("Traceback") for ln in tb)}


def _exception_line(tb: list[str]) -> str:
    """The exception's own line: the last line that does not belong to a frame."""
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
