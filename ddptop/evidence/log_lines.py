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

:func:`read_lines` gives each line its text with its prefixes taken off (the table of shapes,
:mod:`ddptop.evidence.log_prefixes`, ANSI colours, and a prefix learnt from its repetition),
and the global rank a prefix proves (None where none does). :func:`joined` puts a wrapped
statement back together for the patterns that need all of it. Pure but for the one read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from ddptop.errors import EvidenceError
from ddptop.evidence.log_prefixes import BY_NAME, SHAPES, PrefixShape, learnt_prefix, mostly
from ddptop.store.remains import read_bounded

MAX_LOG_BYTES = 64 << 20  # the tail of a longer log is read
MAX_LINE = 4096
MAX_LINES = 2_000_000


class LogLine(NamedTuple):
    """One line of a log, its launcher prefixes taken off."""

    text: str
    rank: int | None  # the global rank a prefix proves ([rankN]:, srun -l, mpirun), else None
    host: str = ""  # pdsh's host prefix (deepspeed), else ""


_ANSI = re.compile(r"\x1b\[[0-9;]{0,16}[A-Za-z]")  # a colour inside a line (rich, loguru)
_BRACKET_NUMBER = BY_NAME["viewer line number"]  # "[N] ": a viewer's line number, or mpich's rank


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
    """:func:`read_lines` over text already read: each line's prefixes (the table of
    :mod:`ddptop.evidence.log_prefixes`, then one learnt from repetition) taken off."""
    raw = text.splitlines()[-MAX_LINES:]  # splitlines splits on \r too: each redraw its own line
    raw = [_ANSI.sub("", line[:MAX_LINE]) if "\x1b" in line else line[:MAX_LINE] for line in raw]
    present = {shape.name for shape in SHAPES if not shape.everywhere or mostly(raw, shape)}
    if "viewer line number" in present and _ranks_in_brackets(raw):
        present.discard("viewer line number")  # "[0] " "[1] " again and again: mpich's ranks
    else:
        present.discard("mpich -prepend-rank")
    shapes = _Shapes([shape for shape in SHAPES if shape.name in present])
    out = [shapes.read(line) for line in raw]
    learnt = learnt_prefix([ln.text for ln in out])
    if learnt is not None:  # taken off, then the known shapes after it read again
        out = [_relearnt(ln, learnt, shapes) for ln in out]
    return out


def _relearnt(line: LogLine, learnt: re.Pattern[str], shapes: _Shapes) -> LogLine:
    m = learnt.match(line.text)
    if m is None:
        return line
    again = shapes.read(line.text[m.end():])
    return LogLine(again.text, again.rank if again.rank is not None else line.rank, again.host or line.host)


def _ranks_in_brackets(lines: list[str]) -> bool:
    """True where the lines' "[N] " take few values, again and again (a launcher's rank), not
    one per line (a viewer's line numbers)."""
    values = [m.group(0) for ln in lines[:1000] if (m := _BRACKET_NUMBER.pattern.match(ln))]
    return len(values) >= 4 and len(set(values)) * 4 <= len(values)


class _Shapes:
    """The shapes a file holds, each tried only on lines that can begin with it, in the table's
    order (a two-million-line log: the Python loop over every row was most of its reading)."""

    def __init__(self, shapes: list[PrefixShape]) -> None:
        self.shapes = shapes
        self.by_first: dict[str, list[int]] = {}
        for index, shape in enumerate(shapes):
            for char in shape.starts:
                self.by_first.setdefault(char, []).append(index)

    def read(self, line: str) -> LogLine:
        """*line* with its prefixes off, and the rank and host they prove."""
        rank: int | None = None
        host = ""
        done = -1  # each shape once, outermost first: a later one never comes before an earlier
        while True:
            for index in self.by_first.get(line[:1], ()):
                if index <= done:
                    continue
                shape = self.shapes[index]
                m = shape.pattern.match(line)
                if m is None:
                    continue
                said = m.group(1) if m.groups() else None
                if said and shape.gives in ("rank", "task"):
                    rank = int(said)  # srun's task id is the global rank under one task per rank
                elif said and shape.gives == "host":
                    host = said
                line = line[m.end():]
                if shape.name == "mpirun --tag-output" and (again := shape.pattern.match(line)):
                    line = line[again.end():]  # mpirun repeats its prefix where two writes met
                done = index
                break
            else:
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
