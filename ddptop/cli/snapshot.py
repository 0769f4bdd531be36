"""``ddptop snapshot [--json] [TARGET]``: every rank's state, once.

Exit 0 when every rank answered; 3 (after printing what did answer) when some did not.
"""

from __future__ import annotations

import argparse
import sys
import time

import msgspec
from rich.console import Console
from rich.table import Table

from ddptop import auth
from ddptop.client.collect import take_snapshot, target_hosts, unreachable_summary
from ddptop.client.targets import resolve
from ddptop.errors import RankUnreachable
from ddptop.model.snapshot import JobSnapshot
from ddptop.textfmt import human_bytes, human_duration, percent


def configure(parser: argparse.ArgumentParser) -> None:
    """Add snapshot's options."""
    parser.add_argument("target", nargs="?",
                        help="job id or MASTER_ADDR:MASTER_PORT (default: the only job here)")
    parser.add_argument("--json", action="store_true", help="print JSON (a stable interface)")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-rank timeout in seconds")


def render_table(snap: JobSnapshot, now: float) -> Table:
    """The snapshot as a rich table, one row per rank."""
    table = Table(title=f"job {snap.job.id}: {snap.job.answered}/{snap.job.world_size} ranks, "
                  f"{snap.job.backend or '?'} on {', '.join(snap.job.hosts) or '?'}")
    for col in ("rank", "host", "pid", "status", "step", "epoch", "batch", "seq",
                "pending", "wait", "ready", "cpu", "rss", "gpu", "shm"):
        table.add_column(col, justify="left" if col in ("host", "status", "pending") else "right")
    for s in snap.ranks:
        group = s.collectives[0] if s.collectives else None
        pend = group.pending[0] if group and group.pending else None
        gpu = f"{s.gpu.util_percent:.0f}%" if s.gpu and s.gpu.util_percent is not None else "-"
        table.add_row(
            str(s.rank), s.host, str(s.pid), s.status, str(s.step), str(s.epoch),
            f"{s.batch}/{s.batches_per_epoch if s.batches_per_epoch is not None else '?'}",
            str(group.seq) if group else "-",
            f"{pend.op} #{pend.seq} {human_duration(pend.age_s)}" if pend else "",
            percent(s.data_wait_fraction),
            "-" if s.loader_ready_batches is None else str(s.loader_ready_batches),
            "-" if s.cpu_percent is None else f"{s.cpu_percent:.0f}%",
            human_bytes(s.rss_bytes), gpu,
            f"{human_bytes(s.shm_used_bytes)}/{human_bytes(s.shm_total_bytes)}",
        )
    for rank, reason in snap.job.unreachable.items():
        table.add_row(str(rank), "", "", "unreachable", "", "", "", "", reason)
    return table


def run(args: argparse.Namespace) -> int:
    """Print the snapshot; non-zero if a rank did not answer."""
    target = resolve(args.target, store_timeout_s=args.timeout)
    snap = take_snapshot(target, token=auth.load_token(), timeout=args.timeout)
    if args.json:
        sys.stdout.write(msgspec.json.encode(snap).decode() + "\n")
    else:
        Console().print(render_table(snap, time.time()))
    if snap.job.unreachable:
        raise RankUnreachable(unreachable_summary(snap.job.unreachable, target_hosts(target)))
    return 0
