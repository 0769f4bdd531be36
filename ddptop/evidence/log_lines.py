"""A console log's lines as people post them, made readable: launcher prefixes, wraps, glue.

What a job's console looks like depends on who launched it and how it was copied:

* ``torchrun --tee``/``--redirects`` and torch >= 2.2 prefix each rank's line
  ``[default1]:[rank1]: `` (both global: the first the local worker, the second the rank);
* ``srun -l`` prefixes the task id, ``3: `` (SLURM's task id is the global rank under the
  usual one-task-per-rank launch); mpirun ``[1,3]<stderr>:`` (job, rank);
* deepspeed's pdsh launcher prefixes the host, ``worker-1: ``; accelerate and Lightning
  print the ranks' lines bare;
* a log copied from a viewer may carry its line numbers (``[1745] ``); a line copied from a
  terminal may be glued to a progress bar (``47%|####  | ...[E ...]``),
  cut by ``\\r`` redraws, or wrapped by the issue form mid-token
  (``OpType=ALLRE`` / ``DUCE, Timeout(ms)=...``).

:func:`read_lines` gives each line its text with the launcher's prefix taken off, and the
global rank the prefix proves (None where none does). :func:`joined` puts a wrapped
statement back together for the patterns that need all of it. Pure but for the one read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from ddptop.errors import EvidenceError
from ddptop.store.remains import read_bounded

MAX_LOG_BYTES = 64 << 20  # the tail of a longer log is read
MAX_LINE = 4096
MAX_LINES = 2_000_000


class LogLine(NamedTuple):
    """One line of a log, its launcher prefixes taken off."""

    text: str
    rank: int | None  # the global rank a prefix proves ([rankN]:, srun -l, mpirun), else None
    host: str = ""  # pdsh's host prefix (deepspeed), else ""


_TORCHRUN = re.compile(r"^\[(?!rank\d)(?:default|[A-Za-z_]{1,32})(\d{1,7})\]:")  # [default3]: torchrun --tee
_RANK = re.compile(r"^\[rank(\d{1,7})\]: ?")
_SRUN = re.compile(r"^\s{0,4}(\d{1,6}): ")
_MPIRUN = re.compile(r"^\[\d{1,6},(\d{1,7})\]<std(?:out|err)>: ?")
_NUMBERED = re.compile(r"^\[\d{1,7}\] ")  # a viewer's line numbers, copied with the lines
_PDSH = re.compile(r"^([a-z][a-z0-9_.-]{0,62}\d[a-z0-9_.-]{0,30}|localhost|\d{1,3}(?:\.\d{1,3}){3}): ")


def read_lines(path: str | os.PathLike[str]) -> tuple[list[LogLine], bool]:
    """The log's lines, prefixes off, and whether it was cut (only its end read); EvidenceError."""
    p = Path(path)
    try:
        data, size = read_bounded(p, MAX_LOG_BYTES, tail=True)
    except OSError as exc:
        raise EvidenceError(f"{p}: cannot read ({exc.strerror or exc})") from None
    text = data.decode("utf-8", "replace")
    return parse_lines(text), size > MAX_LOG_BYTES


def parse_lines(text: str) -> list[LogLine]:
    """:func:`read_lines` over text already read."""
    raw = text.splitlines()[-MAX_LINES:]  # splitlines splits on \r too: each redraw its own line
    if _mostly(raw, _NUMBERED):
        raw = [_NUMBERED.sub("", line, count=1) for line in raw]
    srun = _mostly(raw, _SRUN)
    pdsh = _mostly(raw, _PDSH)
    return [_line(line[:MAX_LINE], srun, pdsh) for line in raw]


def _mostly(lines: list[str], prefix: re.Pattern[str]) -> bool:
    """True where most non-empty lines of the first thousand carry *prefix* (a launcher's
    prefix is on every line; a bare "3: " or "node-1: " inside one line is not a prefix)."""
    sample = [ln for ln in lines[:1000] if ln.strip()]
    return bool(sample) and sum(1 for ln in sample if prefix.match(ln)) * 2 > len(sample)


def _line(line: str, srun: bool, pdsh: bool) -> LogLine:
    rank: int | None = None
    host = ""
    if pdsh and (m := _PDSH.match(line)):
        host, line = m.group(1), line[m.end():]
    if (srun and (m := _SRUN.match(line))) or (m := _MPIRUN.match(line)):
        rank, line = int(m.group(1)), line[m.end():]
        if m := _MPIRUN.match(line):  # mpirun repeats its prefix where two writes met on one line
            line = line[m.end():]
    if m := _TORCHRUN.match(line):
        line = line[m.end():]
    if m := _RANK.match(line):
        rank, line = int(m.group(1)), line[m.end():]
    return LogLine(line, rank, host)


_GLUE = re.compile(r"\[(?:E|W|I)[\d ]|\[rank\d{1,7}\]:|\[Rank \d|\[PG |Watchdog caught|Traceback \(most")


def unglued(text: str) -> str:
    """*text* from its first log statement on, where a progress bar or another line was glued
    before it on one line ("47%|####| 47/100 [00:10<00:11][E ProcessGroupNCCL.cpp:...")."""
    m = _GLUE.search(text)
    return text[m.start():] if m and m.start() else text


def joined(lines: list[LogLine], index: int, complete: re.Pattern[str], most: int = 3) -> str:
    """Line *index* with up to *most* following lines of the same rank joined to it, where it
    alone does not match *complete* and the join does: a statement the issue form wrapped
    mid-token. Joined without a space where the cut fell inside a word, else with one."""
    text = lines[index].text
    if complete.search(text):
        return text
    rank = lines[index].rank
    out = text
    for nxt in lines[index + 1:index + 1 + most]:
        if nxt.rank is not None and nxt.rank != rank:
            break  # another rank's line; one with no prefix continues this one (a wrap drops it)
        piece = nxt.text.strip()
        glue = "" if (out[-1:].isalnum() and piece[:1].isalnum()) or out.endswith(("=", "(")) else " "
        out = f"{out.rstrip()}{glue}{piece}"
        if complete.search(out):
            return out
    return text
