"""``ddptop jobs``: the jobs on this host, running and ended, and how each rank ended.

Running jobs come from their ranks' discovery records; ended jobs from the record their
node agent (``ddptop launch``) kept. ``--prune`` applies retention now (ended jobs older
than ``DDPTOP_KEEP_DAYS`` days, then the oldest while all records exceed ``DDPTOP_KEEP_MB``;
``--keep-days`` / ``--keep-mb`` override).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

from ddptop.client import host_jobs
from ddptop.errors import UsageError
from ddptop.status import Status
from ddptop.store import discovery, jobrecord
from ddptop.store.jobrecord import JobRecord
from ddptop.textfmt import human_bytes, human_duration, rank_ranges


def configure(parser: argparse.ArgumentParser) -> None:
    """Add jobs' options."""
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--all", action="store_true",
                        help="also list jobs that left no record (ranks started without `ddptop launch`)")
    parser.add_argument("--prune", action="store_true", help="remove old ended jobs' records now")
    parser.add_argument("--keep-days", type=float, default=None, help="with --prune: age limit in days")
    parser.add_argument("--keep-mb", type=float, default=None, help="with --prune: total size limit in MB")


def run(args: argparse.Namespace) -> int:
    """List jobs (or prune); exit 0 even when there are none (an empty list is an answer)."""
    if args.prune:
        return _prune(args)
    rows = job_rows(include_unrecorded=args.all, now=time.time())
    if args.json:
        json.dump({"jobs": rows}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print(f"no ddptop jobs on this host ({host_jobs.where_we_looked(host_jobs.scan())})")
        return 0
    # SLURM's names, where a job has them: `ddptop attach slurm:JOB` finds it by them.
    slurm = any(row["scheduler_job"] for row in rows)
    head = f"{'SLURM JOB':<12} {'NAME':<16} " if slurm else ""
    print(f"{'JOB':<20} {head}{'STATE':<8} {'RANKS':>9} {'STARTED':>8} {'RAN':>8} {'RECORD':>8}  OUTCOME")
    now = time.time()
    for row in rows:
        ran = (row["end_time"] or now) - row["start_time"]
        names = f"{row['scheduler_job'] or '-':<12} {row['job_name'][:16] or '-':<16} " if slurm else ""
        print(f"{row['job_id']:<20} {names}{row['state']:<8} {row['alive']:>4}/{row['world_size']:<4} "
              f"{human_duration(now - row['start_time']):>8} {human_duration(ran):>8} "
              f"{human_bytes(row['record_bytes']) if row['record_bytes'] else '-':>8}  {row['outcome_text']}")
    return 0


def job_rows(include_unrecorded: bool, now: float) -> list[dict[str, Any]]:
    """One dict per job (the ``--json`` document; fields are a public interface: add only)."""
    found = host_jobs.scan()
    live, every = found.live, found.every
    records = {r.job_id: r for r in jobrecord.list_records()}
    for job_id, hidden in found.hidden.items():  # a job in a private /tmp keeps its record there
        if job_id not in records:
            discovery.view_runtime_dir(hidden.path)
            try:
                record = jobrecord.read_record(job_id)
            finally:
                discovery.view_runtime_dir(None)
            if record is not None:
                records[job_id] = record
    names = set(live) | set(records) | (set(every) if include_unrecorded else set())
    rows = [_row(job, live.get(job, []), every.get(job, []), records.get(job)) for job in names]
    for row in rows:
        # added with #22: where the ranks' records were found (another mount namespace's
        # /tmp, seen through /proc/PID/root, when the job's /tmp is private)
        place = found.hidden.get(row["job_id"])
        row["runtime_dir"] = str(place.path) if place else str(discovery.runtime_dir(False))
    return sorted(rows, key=lambda r: (r["start_time"], r["job_id"]))


def _row(job: str, alive: list[discovery.Endpoint], ranks: list[discovery.Endpoint],
         record: JobRecord | None) -> dict[str, Any]:
    starts = [e.start_time for e in ranks if e.start_time] + ([record.start_time] if record else [])
    outcome = [{"rank": o.rank, "pid": o.pid, "status": o.status, "exit_code": o.exit_code,
                "signal": o.signal, "time": o.time} for o in (record.ranks if record else [])]
    if alive:
        state = "running"
    elif record is not None and not record.end_time and record.ended:
        state = "orphaned"  # the agent died without closing the record
    else:
        state = "ended"
    hosts = {e.host for e in ranks} | ({record.host} if record else set())
    world = max([e.world_size for e in ranks] + [record.world_size if record else 0])
    return {
        "job_id": job, "world_size": world,
        "alive": len(alive), "ranks": [e.rank for e in alive], "pids": [e.pid for e in alive],
        "ports": [e.port for e in alive], "hosts": sorted(hosts),
        "start_time": min(starts) if starts else 0.0,
        # added with the black box:
        "state": state, "end_time": record.end_time if record else 0.0,
        "exit_code": record.exit_code if record else None, "command": record.command if record else [],
        "record_bytes": record.record_bytes if record else 0, "outcome": outcome,
        "outcome_text": _outcome_text(record, alive),
        # added with fleet metrics: where this host's agent serves them ("" when it does not)
        "metrics_url": record.metrics_url if record and not record.ended else "",
        # added with #22: the scheduler's names of the job ("12345.0", SLURM's job.step)
        "scheduler_job": next((e.scheduler_job for e in ranks if e.scheduler_job), ""),
        "job_name": next((e.job_name for e in ranks if e.job_name), ""),
    }


def _outcome_text(record: JobRecord | None, alive: list[discovery.Endpoint]) -> str:
    if record is None:
        return f"running: ranks {rank_ranges(e.rank for e in alive)}" if alive else "no record"
    counts = Counter(o.status for o in record.ranks)
    parts: list[str] = []
    for o in sorted(record.ranks, key=lambda o: (o.time or float("inf"), o.rank)):
        if o.status in (Status.CRASHED, Status.TERMINATED, Status.LOST) and len(parts) < 3:
            how = o.signal or (f"exit {o.exit_code}" if o.exit_code is not None else "")
            parts.append(f"rank {o.rank} {o.status}" + (f" ({how})" if how else ""))
    for status in (Status.TORN_DOWN, Status.EXITED, Status.RUNNING):
        if counts[status]:
            parts.append(f"{counts[status]} {status.replace('_', ' ')}")
    return ", ".join(parts) or "no rank seen"


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
