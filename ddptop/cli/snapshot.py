"""``ddptop snapshot [--json] [TARGET]``: every rank's state, once.

Prints :func:`ddptop.api.snapshot`: the job watched through the same live source and model
as ``doctor`` and the dashboard until every rank answered once, or an ended job's record.
Exit 0 when every rank answered; 3 (after printing what did answer) when some did not.
"""

from __future__ import annotations

import argparse
import sys
import time

import msgspec
from rich.console import Console
from rich.table import Table

from ddptop import api
from ddptop.cli.evidence_warnings import warn
from ddptop.client.collect import target_hosts, unreachable_summary
from ddptop.client.targets import resolve
from ddptop.errors import RankUnreachable
from ddptop.model.snapshot import JobSnapshot
from ddptop.status import Status
from ddptop.textfmt import human_bytes, number, pending_text, percent, rank_ranges, usage_text


def configure(parser: argparse.ArgumentParser) -> None:
    """Add snapshot's options."""
    parser.add_argument("target", nargs="?",
                        help="job id or MASTER_ADDR:MASTER_PORT (default: the only job here)")
    parser.add_argument("--json", action="store_true", help="print JSON (a stable interface)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for every rank's answer (default 5)")


# Columns by priority: at 80 columns (a pipe, a narrow terminal) the first ones stay whole
# and the rest drop out, rather than every column shrinking into unreadable stubs.
COLUMNS = ("rank", "status", "step", "seq", "pending", "host", "wait", "batch", "ready", "epoch",
           "cpu", "rss", "pid", "gpu", "shm")
ALWAYS = 5  # rank, status, step, seq, pending (the reason, for a rank that did not answer)
LEFT = frozenset(("host", "status", "pending"))


def snapshot_rows(snap: JobSnapshot) -> list[dict[str, str]]:
    """Every rank's cells by column name (ranks that did not answer: their reason as pending)."""
    rows: list[dict[str, str]] = []
    for s in snap.ranks:
        group = s.collectives[0] if s.collectives else None
        pend = group.pending[0] if group and group.pending else None
        rows.append({
            "rank": str(s.rank), "host": s.host, "pid": str(s.pid), "status": s.status, "step": str(s.step),
            "epoch": str(s.epoch),
            "batch": f"{s.batch}/{s.batches_per_epoch if s.batches_per_epoch is not None else '?'}",
            "seq": str(group.seq) if group else "-",
            "pending": pending_text(pend.op, pend.seq, pend.age_s) if pend else "",
            "wait": percent(s.data_wait_fraction),
            "ready": number(s.loader_ready_batches),
            "cpu": number(s.cpu_percent, "{:.0f}%"),
            "rss": human_bytes(s.rss_bytes),
            "gpu": number(s.gpu.util_percent if s.gpu else None, "{:.0f}%"),
            "shm": usage_text(s.shm_used_bytes, s.shm_total_bytes),
        })
    listed = {s.rank for s in snap.ranks}
    for row in rows:
        rank = int(row["rank"])
        if rank in snap.job.unreachable and not row["pending"]:
            row["pending"] = snap.job.unreachable[rank]  # why it did not answer; its last state shown
    for rank, reason in snap.job.unreachable.items():
        if rank not in listed:
            rows.append({"rank": str(rank), "status": Status.UNREACHABLE.value, "pending": reason})
    return sorted(rows, key=lambda row: int(row["rank"]))


def fitting_columns(rows: list[dict[str, str]], width: int) -> list[str]:
    """The columns that fit in *width*, by priority (the first ALWAYS are always kept)."""
    used = 4  # the table's outer borders
    chosen: list[str] = []
    for index, col in enumerate(COLUMNS):
        natural = max([len(col)] + [len(r.get(col, "")) for r in rows]) + 3  # padding and a rule
        if col == "pending":
            natural = min(natural, 30)  # long reasons wrap inside the column instead
        if index < ALWAYS or used + natural <= width:
            chosen.append(col)
            used += natural
    return chosen


def render_table(snap: JobSnapshot, now: float, width: int = 200) -> Table:
    """The snapshot as a rich table, one row per rank, with the columns that fit in *width*."""
    table = Table(title=f"job {snap.job.id}: {snap.job.answered}/{snap.job.world_size} ranks, "
                  f"{snap.job.backend or '?'} on {', '.join(snap.job.hosts) or '?'}")
    rows = snapshot_rows(snap)
    columns = fitting_columns(rows, width)
    for col in columns:
        table.add_column(col, justify="left" if col in LEFT else "right",
                         overflow="fold", no_wrap=col not in ("pending", "host"))
    for row in rows:
        table.add_row(*(row.get(col, "") for col in columns))
    return table


def run(args: argparse.Namespace) -> int:
    """Print the snapshot; non-zero if a rank did not answer."""
    target = resolve(args.target, store_timeout_s=args.timeout)
    warnings: list[str] = []
    try:
        snap = api.snapshot(target, timeout=args.timeout, warnings=warnings)
    finally:
        warn(warnings)
    if args.json:
        sys.stdout.write(msgspec.json.encode(snap).decode() + "\n")
    else:
        console = Console()
        console.print(render_table(snap, time.time(), console.width))
    if snap.job.unreachable:
        raise RankUnreachable(unreachable_summary(snap.job.unreachable, target_hosts(target)))
    if target.ended and any(r.status != Status.EXITED or r.exit_code for r in snap.ranks):
        # Not a running job any more: a script asking "is it healthy?" gets no (3), in one line.
        raise RankUnreachable(f"job {target.job_id} ended: {ended_summary(snap)}; "
                              f"see `ddptop doctor {target.job_id}`")
    return 0


def ended_summary(snap: JobSnapshot) -> str:
    """How the ranks of an ended job ended, in a few words: 'rank 1 crashed, ranks 0,2-3 torn_down'."""
    by_status: dict[str, list[int]] = {}
    for r in snap.ranks:
        by_status.setdefault(r.status, []).append(r.rank)
    return ", ".join(f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)} {status}"
                     for status, ranks in sorted(by_status.items(), key=lambda kv: min(kv[1])))
