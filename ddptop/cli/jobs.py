"""``ddptop jobs``: the jobs on this host, running and ended, and how each rank ended.

Prints :func:`ddptop.api.jobs`: running jobs from their ranks' discovery entries, ended jobs
from the job record their node agent (``ddptop launch``) kept. ``--prune`` applies retention
now (ended jobs older than ``DDPTOP_KEEP_DAYS`` days, then the oldest while all record directories
exceed ``DDPTOP_KEEP_MB``; ``--keep-days`` / ``--keep-mb`` override).
"""

from __future__ import annotations

import argparse
import sys
import time

import msgspec

from ddptop import api
from ddptop.client import host_jobs
from ddptop.errors import UsageError
from ddptop.store import jobrecord
from ddptop.textfmt import human_bytes, human_duration


def configure(parser: argparse.ArgumentParser) -> None:
    """Add jobs' options."""
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--all", action="store_true",
                        help="also list jobs that left no job record (ranks started without `ddptop launch`)")
    parser.add_argument("--prune", action="store_true", help="remove old ended jobs' records now")
    parser.add_argument("--keep-days", type=float, default=None, help="with --prune: age limit in days")
    parser.add_argument("--keep-mb", type=float, default=None, help="with --prune: total size limit in MB")


def run(args: argparse.Namespace) -> int:
    """List jobs (or prune); exit 0 even when there are none (an empty list is an answer)."""
    if args.prune:
        return _prune(args)
    entries = api.jobs(include_unrecorded=args.all)
    if args.json:
        sys.stdout.write(msgspec.json.encode({"jobs": entries}).decode() + "\n")
        return 0
    if not entries:
        print(f"no ddptop jobs on this host ({host_jobs.where_we_looked(host_jobs.scan())})")
        return 0
    # SLURM's names, where a job has them: `ddptop attach slurm:JOB` finds it by them.
    slurm = any(e.scheduler_job for e in entries)
    head = f"{'SLURM JOB':<12} {'NAME':<16} " if slurm else ""
    print(f"{'JOB':<20} {head}{'STATE':<8} {'RANKS':>9} {'STARTED':>8} {'RAN':>8} {'RECORD':>8}  OUTCOME")
    now = time.time()
    for e in entries:
        ran = (e.end_time or now) - e.start_time
        names = f"{e.scheduler_job or '-':<12} {e.job_name[:16] or '-':<16} " if slurm else ""
        print(f"{e.job_id:<20} {names}{e.state:<8} {e.alive:>4}/{e.world_size:<4} "
              f"{human_duration(now - e.start_time):>8} {human_duration(ran):>8} "
              f"{human_bytes(e.record_bytes) if e.record_bytes else '-':>8}  {e.outcome_text}")
    return 0


def _prune(args: argparse.Namespace) -> int:
    max_age, max_bytes = jobrecord.retention_from_env()
    if args.keep_days is not None:
        if args.keep_days < 0:
            raise UsageError("--keep-days must be >= 0")
        max_age = args.keep_days * 86400.0
    if args.keep_mb is not None:
        if args.keep_mb < 0:
            raise UsageError("--keep-mb must be >= 0")
        max_bytes = args.keep_mb * 1024 * 1024
    result = jobrecord.prune(max_age, max_bytes)
    print(f"pruned {len(result.removed)} job(s), freed {human_bytes(result.freed_bytes)}; "
          f"{result.kept} kept" + (f": removed {', '.join(result.removed)}" if result.removed else ""))
    return 0
