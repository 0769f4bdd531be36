"""``ddptop jobs``: the jobs whose ranks announced themselves on this host."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ddptop import discovery
from ddptop.textfmt import human_duration, rank_ranges


def configure(parser: argparse.ArgumentParser) -> None:
    """Add jobs' options."""
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--all", action="store_true", help="include jobs whose ranks are all gone")


def run(args: argparse.Namespace) -> int:
    """List jobs; exit 0 even when there are none (an empty list is an answer)."""
    live = discovery.jobs_on_host()
    every = discovery.jobs_on_host(include_stale=True)
    names = sorted(every if args.all else live)
    now = time.time()
    rows: list[dict[str, Any]] = []
    for job in names:
        alive = live.get(job, [])
        ranks = every.get(job, [])
        world = max(e.world_size for e in ranks)
        started = min(e.start_time for e in ranks)
        rows.append({"job_id": job, "world_size": world, "alive": len(alive),
                     "ranks": [e.rank for e in alive], "pids": [e.pid for e in alive],
                     "ports": [e.port for e in alive], "hosts": sorted({e.host for e in ranks}),
                     "start_time": started})
    if args.json:
        json.dump({"jobs": rows}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print(f"no ddptop jobs on this host (runtime dir {discovery.runtime_dir(False)})")
        return 0
    print(f"{'JOB':<20} {'RANKS':>9} {'ALIVE':<12} {'UPTIME':>8}  HOST:PORTS")
    for row in rows:
        ports = ",".join(str(p) for p in row["ports"][:8]) + ("..." if len(row["ports"]) > 8 else "")
        print(f"{row['job_id']:<20} {row['alive']:>4}/{row['world_size']:<4} "
              f"{rank_ranges(row['ranks']) or '-':<12} {human_duration(now - row['start_time']):>8}  "
              f"{','.join(row['hosts'])}:{ports}")
    return 0
