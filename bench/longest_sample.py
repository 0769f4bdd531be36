"""The longest pause the reporter puts on a healthy rank, over a long run (#57).

    .venv/bin/python bench/longest_sample.py [--seconds 600] [--nproc 4]

Runs the healthy probe under ``ddptop launch -- torchrun`` for *seconds* and reads every
rank's own account every 30 s (``ddptop snapshot --json``): ``reporter.longest_sample_s``
(the costliest sample after the warm-up, in CPU time of the reporter thread: the longest the
training thread can have waited for the GIL in one go), ``fr_full_reads`` (full Flight
Recorder dumps, the pause that was 54-110 ms) and ``timing_bursts`` (the enqueue timer's
bursts, which replace the timing dumps). Prints a table, one row a rank, at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def snapshot(job: str) -> list[dict[str, Any]]:
    """Every rank's state as ``ddptop snapshot --json`` gives it ([] if the job is not up)."""
    res = subprocess.run([str(BIN / "ddptop"), "snapshot", job, "--json"], capture_output=True,
                         text=True, timeout=60, check=False)
    if res.returncode != 0:
        return []
    try:
        return list(json.loads(res.stdout.splitlines()[0])["ranks"])
    except (ValueError, KeyError, IndexError):
        return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--nproc", type=int, default=4)
    args = ap.parse_args()
    job = f"longest{os.getpid()}"
    env = dict(os.environ, PROBE_SECONDS=str(args.seconds + 30), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    cmd = [str(BIN / "ddptop"), "launch", "--job-id", job, "--", str(BIN / "torchrun"), "--standalone",
           f"--nproc-per-node={args.nproc}", str(ROOT / "probes" / "healthy.py")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    last: dict[int, dict[str, Any]] = {}
    began = time.monotonic()
    try:
        while time.monotonic() - began < args.seconds and proc.poll() is None:
            time.sleep(30)
            for state in snapshot(job):
                last[state["rank"]] = {"samples": state["reporter"]["samples"], **state["reporter"]}
            longest = max((r["longest_sample_s"] for r in last.values()), default=0.0)
            print(f"{time.monotonic() - began:6.0f} s: {len(last)} ranks, longest sample so far "
                  f"{longest * 1000:.2f} ms", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    print(f"\nhealthy probe, {args.nproc} ranks, {args.seconds:.0f} s under ddptop launch\n")
    print("| rank | samples | longest sample ms | last sample ms | full FR dumps | enqueue-timer bursts "
          "| errors |")
    print("|---|---|---|---|---|---|---|")
    for rank, r in sorted(last.items()):
        print(f"| {rank} | {r['samples']} | {r['longest_sample_s'] * 1000:.2f} "
              f"| {r['sample_cost_s'] * 1000:.2f} | {r['fr_full_reads']} | {r['timing_bursts']} "
              f"| {r['errors']} |")


if __name__ == "__main__":
    main()
