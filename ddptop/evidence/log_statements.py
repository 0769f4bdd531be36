"""The statements of a console log that name ranks, each given to the *global* rank it proves.

A watchdog line's ``[Rank R]``, a desync report's ranks and a fingerprint mismatch's ranks
are ranks *within a process group*; the elastic agent's ``local_rank: 2`` is a rank within
a node. Each becomes a global rank only where the log proves it:

* a launcher prefix on the line (``[rank5]:``, ``srun -l``'s ``5: ``, mpirun's ``[1,5]``);
* the default group (``PG ID 0``, ``default_pg``), where group and global ranks are one;
* a line that names no group (torch < 2.3) in a log that shows no other group either
  (no line names a group other than the default one): the default group then;
* for a local rank: torchrun's summary of the same pid, or a log that shows one node.

What cannot be mapped is not guessed: it is said in the notes (what was read, what was
not, and what would tell), and names no rank. Pure: lines in, statements and notes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddptop.diagnosis import nccl_statements as nccl
from ddptop.evidence.log_lines import LogLine, joined, unglued

MAX_STATEMENT = 1500
DEFAULT_DESCS = ("default_pg", "")
_ELASTIC_FAILED = re.compile(r"failed \(exitcode: (-?\d{1,4})\) local_rank: (\d{1,7}) \(pid: (\d{1,9})\)")
_ONE_NODE = re.compile(r"(?:max_nodes|nnodes|group_world_size|num_nodes)\s{0,8}[:=]\s{0,8}1\b(?![.:\d])"
                       r"|--standalone|local_world_size=\[\d{1,4}\], role_world_size=\[\d{1,4}\]"
                       r"|Starting elastic_operator with launch configs:.{0,400}nnodes\s{0,2}:\s{0,2}1\b")
_MANY_NODES = re.compile(r"(?:max_nodes|nnodes|group_world_size|num_nodes)\s{0,8}[:=]\s{0,8}([2-9]|\d{2,6})\b"
                         r"|group_rank\s{0,8}[:=]\s{0,8}[1-9]")


@dataclass
class Statements:
    """Per global rank, the canonical statements the log proves of it; and the notes."""

    by_rank: dict[int, list[str]] = field(default_factory=dict)
    local_exits: dict[int, tuple[int, int]] = field(default_factory=dict)  # local rank -> (exit, pid)
    local_is_global: bool = False
    notes: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)  # what kinds were read, for the file's summary
    several_groups: bool = False  # some line names a process group other than the default one

    def add(self, rank: int, text: str) -> None:
        said = self.by_rank.setdefault(rank, [])
        if text not in said and len(said) < 16:
            said.append(text[:MAX_STATEMENT])


def statements(lines: list[LogLine]) -> Statements:
    """Every watchdog line, progress count, desync report, fingerprint mismatch and elastic
    failure of *lines*, given to the global ranks they prove."""
    out = Statements()
    timeouts: list[tuple[int | None, nccl.Timeout]] = []
    traces: dict[int, str] = {}
    for i, line in enumerate(lines):
        text = line.text
        if "Watchdog caught" in text:
            found = nccl.timeout_of(unglued(joined(lines, i, nccl.WATCHDOG)))
            if found is not None:
                timeouts.append((line.rank, found))
        elif "NCCL work:" in text or "watchdog at work:" in text:
            progress = nccl.progress_of(text)
            if progress is not None:
                _progress(out, line, progress)
        if nccl.ABORTED in text and (aborted := nccl.aborted_rank(text)) is not None:
            rank = _global(line.rank, aborted[0], aborted[1], "", False)
            if rank is not None:
                out.add(rank, f"[Rank {aborted[0]}] {nccl.ABORTED}: NCCL took the process down.")
        if nccl.DESYNC_START in text or "Timeout at collective:" in text:
            window = " ".join(ln.text.strip() for ln in _continued(lines, i, 24))
            report = nccl.desync_of(window)
            if report is not None and (nccl.DESYNC_START in text or nccl.DESYNC_START not in window):
                _desync(out, line, report, lines[max(0, i - 8):i])
        if nccl.FINGERPRINT in text:
            fp = nccl.fingerprint_of(" ".join(ln.text.strip() for ln in lines[i:i + 4]))
            if fp is not None:
                _fingerprint(out, line, fp)
        if nccl.TRACE_MARK in text and (trace := nccl.trace_of(text)) is not None:
            traces[trace[0]] = trace[1]  # each rank's last: where it was when the log ends
        if "local_rank:" in text and (m := _ELASTIC_FAILED.search(text)):
            out.local_exits.setdefault(int(m.group(2)), (int(m.group(1)), int(m.group(3))))
    _timeouts(out, timeouts)
    for rank, fields in sorted(traces.items()):
        out.add(rank, f"{nccl.TRACE_LAST} [Rank {rank}] {nccl.TRACE_MARK}{fields})")
    if traces:
        out.read.append(f"the ProcessGroupWrapper's collective trace of {len(traces)} rank(s)")
    whole = "\n".join(ln.text for ln in lines[:4000])
    # A log that shows no second node is taken as one node (the usual post), and says so.
    out.local_is_global = not _MANY_NODES.search(whole)
    if out.local_exits:
        out.read.append(f"{len(out.local_exits)} torchrun 'failed (exitcode ...) local_rank' line(s)")
        if out.local_is_global and not _ONE_NODE.search(whole):
            out.notes.append("torchrun's lines name local ranks and the log shows one node: local rank N "
                             "is taken as rank N (on a job of several nodes, read each node's log)")
    return out


def _continued(lines: list[LogLine], index: int, most: int) -> list[LogLine]:
    """Line *index* and the lines that continue it: a multi-line message carries the launcher's
    prefix on its first line only, so a following line with no rank (or the same) belongs to it."""
    rank = lines[index].rank
    out = [lines[index]]
    for line in lines[index + 1:index + most]:
        if line.rank is not None and line.rank != rank:
            break
        out.append(line)
    return out


def _multi_group(timeouts: list[tuple[int | None, nccl.Timeout]]) -> bool:
    """True where some line names a group other than the default one."""
    return any(t.pg not in ("", "0") and t.pg_desc not in ("default_pg",) for _, t in timeouts)


def _timeouts(out: Statements, timeouts: list[tuple[int | None, nccl.Timeout]]) -> None:
    if not timeouts:
        return
    several = _multi_group(timeouts)
    out.several_groups = several
    unmapped: dict[str, set[int]] = {}
    for prefix_rank, t in timeouts:
        rank = _global(prefix_rank, t.group_rank, t.pg, t.pg_desc, several)
        if rank is None:
            unmapped.setdefault(t.pg or "?", set()).add(t.group_rank)
            continue
        out.add(rank, nccl.canonical_timeout(t))
    out.read.append(f"{len(timeouts)} NCCL watchdog timeout line(s)")
    for pg, granks in sorted(unmapped.items()):
        out.notes.append(
            f"{len(granks)} watchdog line(s) of process group {pg} name its ranks {sorted(granks)[:8]} "
            "as the group numbers them, and no line gives their global ranks: not named (a [rankN]: prefix, "
            "torchrun --tee, or the group's members in a Flight Recorder dump would tell)")


def _global(prefix_rank: int | None, group_rank: int | None, pg: str, desc: str, several: bool) -> int | None:
    """The global rank a statement proves, else None (see the module's rules)."""
    if prefix_rank is not None:
        return prefix_rank
    if group_rank is None:
        return None
    if pg == "0" or desc == "default_pg":
        return group_rank
    if pg == "" and not several:
        return group_rank
    return None


def _progress(out: Statements, line: LogLine, p: nccl.Progress) -> None:
    rank = _global(line.rank, p.group_rank, p.pg, "", False)
    if rank is not None:
        who = p.group_rank if p.group_rank is not None else rank
        out.add(rank, f"[Rank {who}] Timeout at NCCL work: {p.seq}, last enqueued NCCL work: {p.enqueued}, "
                      f"last completed NCCL work: {p.completed}.")


def _desync(out: Statements, line: LogLine, report: nccl.Desync, before: list[LogLine]) -> None:
    """The report's ranks are those of the group that timed out: global where that group is
    the default one (the watchdog line just before it says which)."""
    pg, desc = "", ""
    for prev in reversed(before):
        t = nccl.timeout_of(prev.text)
        if t is not None:
            pg, desc = t.pg, t.pg_desc
            break
    rank = _global(line.rank, report.reporter if report.reporter >= 0 else None, pg, desc, False)
    if pg not in ("", "0") and desc != "default_pg":
        out.notes.append(f"a desync report of process group {pg} ({desc or 'no name'}) names ranks of that "
                         "group; the log does not give their global ranks: not named")
        return
    out.read.append("PyTorch's desync report")
    out.add(rank if rank is not None else max(report.reporter, 0), nccl.canonical_desync(report))


def _fingerprint(out: Statements, line: LogLine, fp: nccl.Fingerprint) -> None:
    """The wrapper compares in the group it wraps (the default one in every log seen): its
    "Rank R" is the rank that raised, unless a prefix says which process printed it."""
    rank = line.rank if line.rank is not None else fp.rank
    if "ProcessGroupWrapper fingerprint mismatch" not in out.read:
        out.read.append("ProcessGroupWrapper fingerprint mismatch")
    out.add(rank, nccl.canonical_fingerprint(fp))
