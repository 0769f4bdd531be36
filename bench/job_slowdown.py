"""What the reporter's pauses cost a synchronous job, at the density of big jobs (#57).

    .venv/bin/python bench/job_slowdown.py [--base REV] [--nproc 8] [--step 1.0] [--steps 50]
        [--rounds 3] [--busy-share 0.1]

Why a job-level bench. In a synchronous job (an all-reduce every step) a pause on any rank
delays the step for all: the job pays, per step, the longest pause any rank took in it. On 2
ranks that is noise; at thousands it is every step. A pause that matters is one where the
reporter thread holds the GIL while the training thread needs it: a full Flight Recorder dump
(one C++ call, 10-90 ms) or a sample (about 1 ms of Python).

The job (this file, run by torchrun): *nproc* ranks (gloo, CPU), each step sleeps
``(1 - busy_share) * step`` (the GPU's share: the GIL is free), then spins in Python for
``busy_share * step`` (launch-bound work: the GIL is held; a fixed amount of work, calibrated
here once, so a pause makes it finish later), then all-reduces 8 small tensors (DDP's
buckets). Rank 0 times every step; every rank logs the CPU time of each reporter sample it saw
(its pause distribution).

Arms, alternated in each round (A/B interleaved on one machine):
- ``off``: no reporter.
- ``new``: this checkout's reporter (samples on shared wall-clock ticks; enqueue times from
  the enqueue timer's seq polls; no full dump while healthy).
- ``base``: the reporter of *REV* (``--base``, checked out into a temporary worktree) as it
  runs by default (a full FR dump every 30 s per rank for the enqueue times).
- ``base-dense``: the same, at the density of 1,024 or 32,768 ranks. How: such a job makes
  N/30 dumps a second; with 1 s steps that is 34 (1,024) or 1,092 (32,768) dumps in every
  step, so every step pays (about) the longest pause. *nproc* ranks reproduce it by making every
  rank dump once per step, at its own phase (``DDPTOP_FR_TIMING`` = the step, and the
  6-a-minute cap lifted in the rank): *nproc* dumps a step. That is fewer than the real
  density, so this arm under-states today's cost at those sizes, never over-states it. For the
  new reporter the density changes nothing to measure: its samples fall on the same wall-clock
  tick on every rank (to the clocks' agreement), so N ranks pause together, once a tick.

Then a model from the measured pause distributions: the slowdown for 64 to 32,768 ranks and
0.2 to 2 s steps, for a launch-bound training thread (busy share 1: every pause delays its
rank) and, to check it against the runs, for this bench's busy share at *nproc* ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COLLECTIVES_PER_STEP = 8
WARMUP_STEPS = 8
FR_ENTRIES = 2000  # torch's default Flight Recorder size, filled before the timed steps


# ---------------------------------------------------------------- the training job


def spin(n: int) -> int:
    """Pure Python work holding the GIL: *n* iterations."""
    x = 0
    for i in range(n):
        x += i
    return x


def calibrate(seconds: float) -> int:
    """Iterations of :func:`spin` that take *seconds* here, on an idle core (best of 5)."""
    n = 200_000
    best = min(_timed(n) for _ in range(5))
    return max(1, int(n * seconds / best))


def _timed(n: int) -> float:
    t0 = time.perf_counter()
    spin(n)
    return time.perf_counter() - t0


def worker() -> None:
    """One rank of the job (see the module's docstring); rank 0 prints its step times."""
    tree = os.environ.get("SLOWDOWN_TREE", "")
    if tree:
        sys.path.insert(0, tree)
        import ddptop

        ddptop.install()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reporter: Any = None
    if tree:
        from ddptop import reporter as reporter_mod

        reporter = reporter_mod.current()
        cap = int(os.environ.get("SLOWDOWN_DUMP_CAP", "0"))
        if cap and reporter is not None:
            reporter.collectives.full_reads_per_min = cap
    step_s = float(os.environ["SLOWDOWN_STEP"])
    busy_share = float(os.environ["SLOWDOWN_BUSY_SHARE"])
    n_busy = int(os.environ["SLOWDOWN_SPIN"])
    steps = int(os.environ["SLOWDOWN_STEPS"])
    small = [torch.ones(256) for _ in range(COLLECTIVES_PER_STEP)]
    for _ in range(FR_ENTRIES // COLLECTIVES_PER_STEP):  # a Flight Recorder as full as a job's after minutes
        for t in small:
            dist.all_reduce(t)
    times: list[float] = []
    pauses: list[tuple[float, bool]] = []  # (CPU time of a sample, whether it read a full dump)
    seen, dumps = 0, 0
    block = int(os.environ.get("SLOWDOWN_BLOCK", "0"))
    on_steps: list[bool] = []
    for i in range(WARMUP_STEPS + steps):
        if block and reporter is not None and i >= WARMUP_STEPS and (i - WARMUP_STEPS) % block == 0:
            # in step on every rank (the steps are synchronous): off, on, off, on...
            set_reporting(reporter, ((i - WARMUP_STEPS) // block) % 2 == 1)
        t0 = time.perf_counter()
        time.sleep(step_s * (1 - busy_share))
        spin(n_busy)
        for t in small:
            dist.all_reduce(t)
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - t0)
            on_steps.append(not block or ((i - WARMUP_STEPS) // block) % 2 == 1)
        if reporter is not None and reporter.stats.samples != seen:
            seen = reporter.stats.samples
            dumped = reporter.collectives.full_reads != dumps
            dumps = reporter.collectives.full_reads
            if i >= WARMUP_STEPS:  # the samples of the start-up (versions, environment) apart
                pauses.append((reporter.stats.sample_cost_s, dumped))
    full_reads = int(getattr(reporter.collectives, "full_reads", 0)) if reporter is not None else 0
    record = {"rank": rank, "times": times if rank == 0 else [], "on": on_steps if rank == 0 else [],
              "pauses": pauses, "full_reads": full_reads}
    # One file a rank: the ranks' stdout lines interleave under torchrun.
    Path(os.environ["SLOWDOWN_OUT"], f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def set_reporting(reporter: Any, on: bool) -> None:
    """Stop or restart this rank's reporter thread and its enqueue timer (the in-job A/B).

    Reaches into the reporter on purpose: pausing is a benchmark's need, not a feature. A
    restarted timer begins with its first-minute cadence (bursts every 10 s instead of 30),
    so the "on" blocks pay more bursts than a long-running rank does: the figure errs high.
    """
    import threading

    thread = reporter._thread
    if on and (thread is None or not thread.is_alive()):
        reporter._stop.clear()
        reporter._thread = threading.Thread(target=reporter._run, name="ddptop-reporter", daemon=True)
        reporter._thread.start()
    elif not on and thread is not None and thread.is_alive():
        reporter._stop.set()
        thread.join()
        timer = reporter.collectives.timer
        if timer is not None:
            timer.stop()
            reporter.collectives.timer = None  # the next sample starts a new one


# ---------------------------------------------------------------- running the arms


def run_job(args: argparse.Namespace, arm: str, tree: str, n_busy: int) -> dict[str, Any]:
    """One job of *arm*; its step times (rank 0) and every rank's pauses."""
    out_dir = tempfile.mkdtemp(prefix="slowdown-")
    env = dict(os.environ, OMP_NUM_THREADS="1", SLOWDOWN_STEP=str(args.step), SLOWDOWN_OUT=out_dir,
               SLOWDOWN_BUSY_SHARE=str(args.busy_share), SLOWDOWN_SPIN=str(n_busy),
               SLOWDOWN_STEPS=str(args.steps), SLOWDOWN_TREE=tree, DDPTOP_JOB_ID=f"slowdown-{arm}")
    env.pop("PYTHONPATH", None)
    if arm == "new-ab":
        env["SLOWDOWN_BLOCK"] = str(args.block)
        env["SLOWDOWN_STEPS"] = str(args.block * args.blocks)
    if arm == "base-dense":
        env["DDPTOP_FR_TIMING"] = str(args.step)  # every rank dumps once per step, at its own phase
        env["SLOWDOWN_DUMP_CAP"] = "100000"
    cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={args.nproc}",
           str(Path(__file__).resolve())]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True,
                         timeout=args.steps * args.step * 4 + 300, check=False)
    out: dict[str, Any] = {"times": [], "on": [], "pauses": [], "full_reads": 0}
    for path in sorted(Path(out_dir).glob("rank*.json")):
        rec = json.loads(path.read_text())
        path.unlink()
        out["times"] += rec["times"]
        out["on"] += rec["on"]
        out["pauses"] += rec["pauses"]
        out["full_reads"] += rec["full_reads"]
    os.rmdir(out_dir)
    if not out["times"]:
        raise SystemExit(f"{arm}: the job printed no step times (rc {res.returncode}):\n{res.stderr[-2000:]}")
    return out


def base_tree(rev: str) -> tempfile.TemporaryDirectory[str]:
    """*rev* of this repository, checked out (detached) into a temporary worktree."""
    tmp = tempfile.TemporaryDirectory(prefix="ddptop-base-")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", tmp.name, rev], check=True)
    return tmp


# ---------------------------------------------------------------- the model


def rank_delay(pause_at: float, pause_s: float, step_s: float, busy_share: float) -> float:
    """How much later one rank finishes its step when the reporter holds the GIL from *pause_at*
    (seconds into the step) for *pause_s*: its Python work (the last *busy_share* of the step)
    cannot run meanwhile; its sleep (the GPU's share) goes on."""
    work_from = step_s * (1 - busy_share)
    work = step_s * busy_share
    end = pause_at + pause_s
    if end <= work_from or pause_at >= work_from + work:
        return 0.0
    return end - max(pause_at, work_from) if pause_at > work_from else end - work_from


def model_slowdown(dumps: list[float], samples: list[float], ranks: int, step_s: float, busy_share: float,
                   aligned: bool, dump_every_s: float, sample_every_s: float = 1.0, steps: int = 2000,
                   seed: int = 1) -> float:
    """Expected slowdown of a synchronous job of *ranks* from the measured pause lengths.

    Unaligned: each rank pauses at its own random phase; a step pays the largest delay of the
    pauses that fell in it (their count is Poisson). Aligned: every rank's sample falls on the
    same tick, so a step holding a tick pays the largest of *ranks* samples, once.
    """
    rng = random.Random(seed)
    total = 0.0
    for _ in range(steps):
        delay = 0.0
        kinds = [(dumps, dump_every_s, False)] if dumps and dump_every_s > 0 else []
        kinds.append((samples, sample_every_s, aligned))
        for lengths, every, together in kinds:
            if not lengths:
                continue
            if together:
                ticks = _poisson(rng, step_s / every)
                for _ in range(ticks):
                    longest = max(_draw_max(rng, lengths, ranks), 0.0)
                    delay = max(delay, rank_delay(rng.uniform(0, step_s), longest, step_s, busy_share))
            else:
                for _ in range(_poisson(rng, ranks * step_s / every)):
                    at, length = rng.uniform(0, step_s), rng.choice(lengths)
                    delay = max(delay, rank_delay(at, length, step_s, busy_share))
        total += delay
    return total / steps / step_s


def _draw_max(rng: random.Random, lengths: list[float], n: int) -> float:
    """The largest of *n* draws (with replacement) from *lengths*, by its distribution."""
    ordered = sorted(lengths)
    # P(max <= x_k) = (k/len)^n: invert at a uniform draw
    k = math.ceil(len(ordered) * rng.random() ** (1.0 / n))
    return float(ordered[max(0, min(len(ordered) - 1, k - 1))])


def _poisson(rng: random.Random, mean: float) -> int:
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


# ---------------------------------------------------------------- the tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="", help="the commit whose reporter is 'today' (skipped if empty)")
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--step", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy-share", type=float, default=0.1)
    ap.add_argument("--arms", default="off,new,base,base-dense,new-ab",
                    help="which arms to run, comma-separated")
    ap.add_argument("--block", type=int, default=10, help="new-ab: steps per block (reporter off, on, ...)")
    ap.add_argument("--blocks", type=int, default=12, help="new-ab: blocks per job")
    args = ap.parse_args()
    n_busy = calibrate(args.step * args.busy_share)
    base = base_tree(args.base) if args.base else None
    arms = {"off": "", "new": str(ROOT), "new-ab": str(ROOT)}
    if base is not None:
        arms |= {"base": base.name, "base-dense": base.name}
    arms = {arm: tree for arm, tree in arms.items() if arm in args.arms.split(",")}
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    try:
        for rnd in range(args.rounds):
            for arm, tree in arms.items():
                res = run_job(args, arm, tree, n_busy)
                results[arm].append(res)
                mean, med = statistics.fmean(res["times"]), statistics.median(res["times"])
                print(f"round {rnd + 1} {arm:10s} mean step {mean * 1000:8.1f} ms, "
                      f"median {med * 1000:8.1f} ms, full dumps {res['full_reads']}", flush=True)
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", base.name], check=False)
            base.cleanup()
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]) -> None:
    """The measured table (ratios to 'off' in the same round) and the model's."""
    print(f"\n{args.nproc} ranks, {args.step:.2f} s steps (busy share {args.busy_share:.0%}), "
          f"{args.steps} timed steps a job, {args.rounds} rounds\n")
    print("| arm | full dumps a job | longest pause ms | p99 pause ms | slowdown, mean step (per round) | "
          "slowdown, median of rounds |")
    print("|---|---|---|---|---|---|")
    off = [statistics.fmean(r["times"]) for r in results.get("off", [])]
    for arm, runs in results.items():
        if arm == "new-ab" or not off:
            continue
        pauses = [p for r in runs for p, _ in r["pauses"]]
        ratios = [statistics.fmean(r["times"]) / o - 1 for r, o in zip(runs, off, strict=True)]
        p99 = statistics.quantiles(pauses, n=100)[98] if len(pauses) >= 2 else (pauses[0] if pauses else 0.0)
        print(f"| {arm} | {statistics.fmean(r['full_reads'] for r in runs):.0f} | "
              f"{max(pauses, default=0) * 1000:.2f} | {p99 * 1000:.2f} | "
              f"{', '.join(f'{x:+.2%}' for x in ratios)} | {statistics.median(ratios):+.2%} |")
    for run in results.get("new-ab", []):
        print_in_job_ab(run, args.block)
    base_pauses = [p for arm in ("base", "base-dense") for r in results.get(arm, []) for p in r["pauses"]]
    new_pauses = [p for arm in ("new", "new-ab") for r in results.get(arm, []) for p, _ in r["pauses"]]
    dumps = [p for p, dumped in base_pauses if dumped]
    base_samples = [p for p, dumped in base_pauses if not dumped]
    if dumps:
        print(f"\nbase-dense: {len(dumps)} samples with a full dump (median "
              f"{statistics.median(dumps) * 1000:.1f} ms, longest {max(dumps) * 1000:.1f} ms), "
              f"{len(base_samples)} without")
    print("\nModel (from the pauses above; launch-bound training thread, every pause delays its rank):\n")
    print("| ranks | step s | today: dumps every 30 s, samples unaligned "
          "| new: no dump, samples on shared ticks |")
    print("|---|---|---|---|")
    for ranks in (64, 1024, 32768):
        for step in (0.2, 0.5, 1.0, 2.0):
            today = model_slowdown(dumps, base_samples, ranks, step, 1.0, False, 30.0, steps=400) \
                if dumps else float("nan")
            new = model_slowdown([], new_pauses, ranks, step, 1.0, True, 0.0, steps=400)
            print(f"| {ranks:,} | {step} | {today:.2%} | {new:.2%} |")
    if dumps:
        check_old = model_slowdown(dumps, base_samples, args.nproc, args.step, args.busy_share, False,
                                   args.step)
        check_new = model_slowdown([], new_pauses, args.nproc, args.step, args.busy_share, True, 0.0)
        print(f"\nModel at this bench's shape ({args.nproc} ranks, busy share {args.busy_share:.0%}): "
              f"base-dense {check_old:+.2%}, new {check_new:+.2%} (compare with the measured medians above)")


def print_in_job_ab(run: dict[str, Any], block: int) -> None:
    """One in-job A/B job: each "on" block's mean step against its two "off" neighbours."""
    means = [statistics.fmean(run["times"][i:i + block]) for i in range(0, len(run["times"]), block)]
    pairs = [means[i] / ((means[i - 1] + means[i + 1]) / 2) - 1
             for i in range(1, len(means) - 1, 2)]  # blocks alternate off, on, off, ...
    if pairs:
        print(f"\nin-job A/B (new reporter off/on every {block} steps, in step on every rank): "
              f"slowdown per on-block {', '.join(f'{x:+.2%}' for x in pairs)}; "
              f"median {statistics.median(pairs):+.2%}, mean {statistics.fmean(pairs):+.2%}")


if __name__ == "__main__":
    if "RANK" in os.environ:
        worker()
    else:
        main()
