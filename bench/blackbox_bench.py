"""What the black box costs: the node agent's CPU, bytes per rank-minute, the disk cap kept.

    python bench/blackbox_bench.py [--seconds 40] [--ranks 8 64] [--cap-run-seconds 60]

For each rank count a synthetic job (``ddptop.testing.synthetic``: real reporter servers, real
protocol, discovery entries, one process) runs at 1 Hz, and the node agent
(``python -m ddptop.agent``, the process ``ddptop.install()`` spawns and the same
``NodeAgent`` that ``ddptop launch`` runs) records it. Measured from outside:

* the agent's CPU share (user + system time of its process / wall time, from the reaped
  children's rusage), which is never a rank's: none of it is on a training thread;
* bytes on disk per rank-minute;
* in a last run, 64 ranks sampled every 0.05 s (20 times the data of 1 Hz) under the
  smallest cap (256 KiB): the largest size the record reached, polled every 0.2 s, against
  the cap, and how often history was compacted. History thins by wall-clock stride, so
  this run is as long as it must be for history to outgrow its share several times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.testing.synthetic_process import run_in_subprocess


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files in *path* (0 if it is not there yet)."""
    try:
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except OSError:
        return 0


def record_once(ranks: int, seconds: float, interval: float, cap_mb: float) -> dict[str, float]:
    """Run one synthetic job under the agent; measure the agent from outside."""
    runtime = Path(tempfile.mkdtemp(prefix="ddptop-bb-"))
    os.environ["DDPTOP_RUNTIME_DIR"] = str(runtime)
    job_id = f"bb{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with run_in_subprocess(ranks, job_id, interval_s=interval):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        agent = subprocess.Popen([sys.executable, "-m", "ddptop.agent", "--job-id", job_id,
                                  "--seconds", str(seconds), "--record-mb", str(cap_mb)],
                                 env=env, stdout=subprocess.PIPE, text=True)
        peak = 0
        record_dir = runtime / "jobs" / job_id
        while agent.poll() is None and time.monotonic() - began < seconds + 30:
            peak = max(peak, dir_bytes(record_dir))
            time.sleep(0.2)
        agent.wait(timeout=30)
        wall = time.monotonic() - began
        # Reaped children's times: only the agent was reaped meanwhile (the job still runs).
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = agent.stdout.read() if agent.stdout else ""
    summary = json.loads(out.strip().splitlines()[-1])
    size = dir_bytes(record_dir)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"ranks": ranks, "seconds": wall, "cpu_s": cpu, "cpu_share": cpu / wall, "bytes": size,
            "peak": max(peak, size), "frames": summary["frames"], "compactions": summary["compactions"],
            "rank_minutes": ranks * summary["seconds"] / 60 * (1.0 / interval)}


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--cap-run-seconds", type=float, default=150.0)
    parser.add_argument("--cap-mb", type=float, default=0.25)
    args = parser.parse_args()
    print(f"{'run':<34} {'ranks':>5} {'agent CPU':>10} {'frames':>8} {'bytes/rank-min':>15} "
          f"{'on disk':>9} {'peak':>9} {'cap':>7} {'compactions':>11}")
    for ranks in args.ranks:
        r = record_once(ranks, args.seconds, 1.0, 32.0)
        print(f"{'1 Hz, ' + format(args.seconds, 'g') + ' s':<34} {ranks:>5} {r['cpu_share']:>9.2%} "
              f"{r['frames']:>8.0f} {r['bytes'] / r['rank_minutes']:>15.0f} {r['bytes'] / 1024:>8.0f}K "
              f"{r['peak'] / 1024:>8.0f}K {'32M':>7} {r['compactions']:>11.0f}")
    fast = 0.05
    r = record_once(64, args.cap_run_seconds, fast, args.cap_mb)
    print(f"{f'20 Hz, {args.cap_run_seconds:g} s, smallest cap':<34} {64:>5} {r['cpu_share']:>9.2%} "
          f"{r['frames']:>8.0f} {r['bytes'] / r['rank_minutes']:>15.0f} {r['bytes'] / 1024:>8.0f}K "
          f"{r['peak'] / 1024:>8.0f}K {format(args.cap_mb, 'g') + 'M':>7} {r['compactions']:>11.0f}")
    cap = args.cap_mb * 1024 * 1024
    print(f"\ncap respected over the fast run: {'yes' if r['peak'] <= cap else 'NO'} "
          f"(peak {r['peak'] / cap:.0%} of the cap)")


if __name__ == "__main__":
    main()
