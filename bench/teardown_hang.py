"""Count jobs that hang at exit, with and without ddptop: the gloo teardown race (docs/limitations.md).

    .venv/bin/python bench/teardown_hang.py [--runs 20] [--nproc 2] [--timeout 40]

Each round runs the overhead bench's small DDP job (bench/reporter_overhead.py as the
training script) once by plain ``torchrun`` and once by ``ddptop launch -- torchrun``,
interleaved. A job that has not exited *timeout* seconds after it started counts as a
hang; its whole process group is killed. The table gives hangs per variant and the median
wall time of the jobs that ended. Extra env for the ddptop variant can be given with
``--env NAME=VALUE`` (repeatable) to bisect which part of the reporter matters.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.proctree import stop_tree

BIN = Path(sys.executable).parent


def run_once(with_ddptop: bool, nproc: int, steps: int, timeout: float,
             extra: dict[str, str]) -> float | None:
    """Wall time of one job, or None when it had to be killed."""
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc),
                str(ROOT / "bench" / "reporter_overhead.py"), "--steps", str(steps), "--warmup", "20"]
    cmd = [sys.executable, "-m", "ddptop", "launch", "--", *torchrun] if with_ddptop else torchrun
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if with_ddptop:
        env.update(extra)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
        return time.monotonic() - start
    except subprocess.TimeoutExpired:
        return None
    finally:
        stop_tree(proc, grace_s=2.0)  # a hung rank lives in a session of its own


def main() -> None:
    """Interleave plain and ddptop runs; print hangs and median wall time per variant."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--timeout", type=float, default=40.0)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the ddptop runs")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    times: dict[str, list[float]] = {"plain": [], "ddptop": []}
    hangs = {"plain": 0, "ddptop": 0}
    for i in range(args.runs):
        for name in ("plain", "ddptop"):
            took = run_once(name == "ddptop", args.nproc, args.steps, args.timeout, extra)
            if took is None:
                hangs[name] += 1
            else:
                times[name].append(took)
        print(f"round {i + 1}/{args.runs}: hangs {hangs}", file=sys.stderr, flush=True)
    print(f"{'variant':<8} {'runs':>5} {'hangs':>6} {'median s':>9}")
    for name in ("plain", "ddptop"):
        med = statistics.median(times[name]) if times[name] else float("nan")
        print(f"{name:<8} {args.runs:>5} {hangs[name]:>6} {med:>9.2f}")


if __name__ == "__main__":
    main()
