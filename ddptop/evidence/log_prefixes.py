"""The prefixes launchers, loggers and viewers put before a job's lines: one table, as data.

Whoever launched the job and however its console was copied, a line's own words come after
zero or more prefixes. Each shape is one row of :data:`SHAPES`: its name, its pattern, and
what it proves of the line (a global rank, a rank a launcher numbers its tasks by, a host),
or nothing (a time stamp, a colour, a viewer's line number: taken off so the words match).

A prefix no row knows is learnt from its repetition: where most lines of a file begin
alike up to a closing ``) ``, ``| `` or ``]: `` (the digits in it aside: a pid, a time, an
address), that beginning is taken off as well (:func:`learnt_prefix`). NCCL's own
``host:pid:tid [dev]`` is never taken for one: it is a statement's shape (it names the
process), read by :mod:`ddptop.evidence.log_claims`.

Every pattern is anchored and bounded: linear on any line. Pure.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

Gives = Literal["rank", "task", "local", "host", "nothing"]


@dataclass(frozen=True)
class PrefixShape:
    """One shape of prefix: where it comes from and what it proves of the line after it."""

    name: str
    pattern: re.Pattern[str]
    gives: Gives  # "rank": a global rank; "task": srun's task id; "local": a local worker; "host"
    starts: str  # every character a line it matches can begin with: a line tries only its rows
    everywhere: bool = False  # a bare shape ("3: "): a prefix only where most lines carry it


_UPPER, _LOWER, _DIGIT = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "0123456789"
# Order matters: the outermost prefix first (a viewer's line number before a launcher's).
SHAPES: tuple[PrefixShape, ...] = (
    PrefixShape("ansi colour", re.compile(r"^(?:\x1b\[[0-9;]{0,16}[A-Za-z])+"), "nothing", starts="\x1b"),
    PrefixShape("viewer line number", re.compile(r"^\[\d{1,7}\] "), "nothing", everywhere=True,
                starts="["),
    PrefixShape("kernel log time", re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S{1,64} kernel: ?)?"
                                               r"\[ {0,8}\d{1,8}\.\d{3,6}\] "), "nothing",
                starts=f"[{_UPPER}"),
    PrefixShape("cloudwatch table",
                re.compile(r"^\s{0,4}\|\s{0,4}\d{4}-\d\d-\d\dT[\d:.]{5,15}Z?\s{0,4}\|\s?"), "nothing",
                starts=" \t|"),
    PrefixShape("mpirun --timestamp-output",
                re.compile(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4}(?=\[\d)"),
                "nothing", starts=_UPPER),
    PrefixShape("mpirun --tag-output", re.compile(r"^\[\d{1,6},(\d{1,7})\]<std(?:out|err)>: ?"), "rank",
                starts="["),
    PrefixShape("horovodrun", re.compile(r"^\[(\d{1,7})\]<std(?:out|err)>: ?"), "rank", starts="["),
    PrefixShape("srun --label", re.compile(r"^\s{0,4}(\d{1,6}): "), "task", everywhere=True,
                starts=f" \t{_DIGIT}"),
    PrefixShape("mpich -prepend-rank", re.compile(r"^\[(\d{1,6})\] "), "rank", everywhere=True, starts="["),
    PrefixShape("pdsh / deepspeed host",
                re.compile(r"^([a-z][a-z0-9_.-]{0,62}\d[a-z0-9_.-]{0,30}|localhost"
                           r"|\d{1,3}(?:\.\d{1,3}){3}): "),
                "host", everywhere=True, starts=_LOWER + _DIGIT),
    PrefixShape("ray worker", re.compile(r"^\((?:[A-Za-z_]{1,64}) pid=\d{1,9}(?:, ip=([\d.]{7,15}))?\) ?"),
                "host", starts="("),
    PrefixShape("wrapper stream", re.compile(r"^std(?:err|out): "), "nothing", everywhere=True, starts="s"),
    PrefixShape("rich log time", re.compile(r"^(?:\[\d\d:\d\d:\d\d\]| {10}) (?=[A-Z]{4,8} {1,3}\S)"),
                "nothing", starts="[ "),
    PrefixShape("torchrun --tee", re.compile(r"^\[(?!rank\d)(?:default|[A-Za-z_]{1,32})(\d{1,7})\]:"),
                "local", starts="["),
    PrefixShape("torch rank", re.compile(r"^\[rank(\d{1,7})\]: ?"), "rank", starts="["),
)
BY_NAME = {shape.name: shape for shape in SHAPES}

# A repeated beginning, up to a closing mark: "(RayWorkerWrapper pid=92234, ip=1.2.3.4) ",
# "  | 2024-12-04T07:19:46Z | ", "node-7 | ", "[job-3]: ", "node-d004 [stderr] ".
_REPEATED = re.compile(r"^(.{1,80}?(?:\) |\| |\]: |>: |\[std(?:err|out)\] ))")
_NCCL_PROCESS = re.compile(r"^\S{1,80}:\d{1,9}:\d{1,9} \[\d{1,3}\] ")
_DIGITS = re.compile(r"\d+")
LEARN_SAMPLE = 2000  # lines a file's prefix is learnt from
LEARN_SHARE = 0.5  # of its non-empty lines that must begin alike (a wrapped line's rest does not)
LEARN_MIN = 3


def mostly(lines: list[str], shape: PrefixShape, sample: int = 1000) -> bool:
    """True where most non-empty lines of the first *sample* carry *shape* (a launcher's prefix
    is on every line; a bare "3: " or "node-1: " inside one line is not a prefix)."""
    seen = [ln for ln in lines[:sample] if ln.strip()]
    return bool(seen) and sum(1 for ln in seen if shape.pattern.match(ln)) * 2 > len(seen)


_KNOWN_INSIDE = re.compile(r"\[rank\d|\[default\d|\[\d{1,6},\d{1,7}\]<std")


def _before_known(prefix: str) -> str:
    """*prefix* up to a known shape inside it ("host [stderr] [rank3]: " -> "host [stderr] "):
    the known shape is read after, for the rank it proves."""
    m = _KNOWN_INSIDE.search(prefix)
    return prefix[:m.start()] if m and m.start() else prefix


def learnt_prefix(lines: list[str]) -> re.Pattern[str] | None:
    """The beginning most lines share that no shape knows (digits aside), as a pattern; None
    where there is none. A known shape's lines, NCCL's process column and a Python frame's
    indentation are never learnt as one."""
    seen = [ln for ln in lines[:LEARN_SAMPLE] if ln.strip()]
    if len(seen) < LEARN_MIN:
        return None
    counts: Counter[str] = Counter()
    for line in seen:
        m = _REPEATED.match(line)
        if m is None or _NCCL_PROCESS.match(line) or any(s.pattern.match(line) for s in SHAPES):
            continue
        counts[_DIGITS.sub("#", _before_known(m.group(1)))] += 1
    if not counts:
        return None
    shape, count = counts.most_common(1)[0]
    if count < LEARN_MIN or count < LEARN_SHARE * len(seen) or not shape.strip(" |[]#"):
        return None
    return re.compile("^" + re.escape(shape).replace("\\#", "#").replace("#", r"\d{1,20}"))
