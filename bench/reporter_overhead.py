"""What the reporter costs a training job: step-time overhead and per-batch / per-step cost.

    .venv/bin/python bench/reporter_overhead.py [--rounds 4] [--steps 1000] [--nproc 2]
        [--block 600 --blocks 12 --block-jobs 2 --groups 1,4]

1. A/B step time of a small DDP job (gloo, CPU): the same script run by plain
   ``torchrun`` (A) and by ``ddptop launch -- torchrun`` (B), alternating A, B, A, B...
   in one run so that machine noise hits both alike. Each job reports the median of its
   per-step wall times (rank 0, after a warm-up of ~2 s that also covers the reporter's
   one-off start-up, reported on its own); the table gives the median over rounds and
   the ratio B/A.
2. In-job A/B (``--block N``, default 400; 0 skips it): one job under ddptop whose
   ranks stop and restart the reporter's sampling thread every N steps (off, on, off...),
   in step; each "on" block is compared with its "off" neighbours in the same processes,
   so between-job noise cancels. Run for each ``--groups`` count (default 1 and 4: the
   default group, two that all-reduce every step, one idle), with the reporter thread's
   CPU per wall second while sampling (its GIL time: Python runs only with the GIL
   held) and the longest single sample.
3. Microbenchmarks in this process (timeit, best of several repeats, A/B interleaved):
   the patched ``_BaseDataLoaderIter.__next__`` against the original (around a no-op,
   which isolates the hook, and on a real single-process iterator), and the optimizer
   step post hook (direct call, and ``opt.step()`` with vs without the hook).

Targets (issue 2): <= 0.5 % step overhead, <= 1 us per batch and per step.
When started by torchrun (RANK set) this file is the benchmark's training script.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
# This checkout's ddptop, also in the benchmark process itself (its ranks import it too).
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
MARK = "DDPTOP_BENCH "


# ---------------------------------------------------------------- the training job


def worker(steps: int, warmup: int, block: int = 0, groups: int = 1) -> None:
    """Train a small DDP MLP for *steps* timed steps; rank 0 prints the step times.

    With *block* > 0 (and a reporter), the reporter's sampling thread is stopped and
    restarted every *block* steps (off, on, off, ...), in step on every rank, and rank 0
    also prints each block's median step time: the in-job A/B, with the reporter
    thread's CPU time per wall second while sampling (its GIL time, see reporter_cpu_s).
    With *groups* > 1 the job has that many process groups: the default one, groups - 2
    that all-reduce a small tensor every step, and one that stays idle (a TP or metrics
    group that never runs a collective).
    """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    total = (steps + warmup) * 32 * dist.get_world_size()
    data = TensorDataset(torch.randn(total, 128), torch.randint(0, 10, (total,)))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, seed=0))
    model = DDP(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = [dist.new_group(list(range(dist.get_world_size()))) for _ in range(max(0, groups - 1))]
    active = extra[:-1]  # the last extra group stays idle
    small = torch.zeros(8)
    on_cpu = on_wall = 0.0
    block_start = (0.0, 0.0)
    worst_sample = worst_light = 0.0
    seen = (0, 0)  # (samples, full FR reads) when the latest sample was first seen
    times: list[float] = []
    cpu0 = rep0 = 0.0
    last = time.perf_counter()
    blocks: list[tuple[bool, list[float]]] = []
    for i, (x, y) in enumerate(loader):
        if i == warmup:
            cpu0 = time.process_time()
            rep0 = reporter_cpu_s()
        if block and i >= warmup and (i - warmup) % block == 0:
            sampling = ((i - warmup) // block) % 2 == 1
            if blocks and blocks[-1][0]:  # an "on" block ends: its reporter CPU per wall second
                on_cpu += reporter_cpu_s() - block_start[0]
                on_wall += time.perf_counter() - block_start[1]
            set_sampling(sampling)
            block_start = (reporter_cpu_s(), time.perf_counter())
            blocks.append((sampling, []))
            last = time.perf_counter()  # the toggle itself is not a training step
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for group in active:
            dist.all_reduce(small, group=group)
        cost = last_sample_cost()
        worst_sample = max(worst_sample, cost)
        now_seen = sample_counts()
        if now_seen[0] != seen[0]:
            # A new sample: it read no full FR dump if the count did not move since the sample
            # before it was seen (a sample is 1 s after the last, a step a few ms: counting at
            # each new sample, not each step, never splits one sample's dump from it).
            if now_seen[1] == seen[1] and i >= warmup:
                worst_light = max(worst_light, cost)
            seen = now_seen
        now = time.perf_counter()
        times.append(now - last)  # the whole step, DataLoader fetch included
        if blocks:
            blocks[-1][1].append(now - last)
        last = now
    set_sampling(True)
    # Process CPU time (every thread: training, gloo, the reporter) per timed step: far
    # less sensitive than wall time to other jobs on a shared machine.
    timed = max(1, len(times) - warmup)
    cpu = (time.process_time() - cpu0) / timed
    rep = (reporter_cpu_s() - rep0) / timed
    times = times[warmup:]
    if dist.get_rank() == 0:
        print(MARK + json.dumps({"median": statistics.median(times), "mean": statistics.fmean(times),
                                 "cpu": cpu, "reporter_cpu": rep, "n": len(times),
                                 "reporter_cpu_total": rep * timed, "reporter_cpu_startup": rep0,
                                 "blocks": [[on, statistics.median(ts)] for on, ts in blocks if ts],
                                 "reporter_cpu_per_s": on_cpu / on_wall if on_wall else None,
                                 "worst_sample_s": worst_sample,
                                 "worst_light_sample_s": worst_light, "fr": fr_reads()}),
              flush=True)
    dist.destroy_process_group()


def set_sampling(on: bool) -> None:
    """Start or stop this rank's reporter thread (the in-job A/B); no-op without a reporter.

    The hooks stay installed either way (their cost is measured by the microbenchmarks);
    this isolates what the sampling thread costs the training thread. Reaches into the
    reporter on purpose: pausing is a benchmark's need, not a user-facing feature.
    """
    import threading

    from ddptop.reporter import current

    reporter: Any = current()
    if reporter is None:
        return
    thread = reporter._thread
    if on and (thread is None or not thread.is_alive()):
        reporter._stop.clear()
        reporter._thread = threading.Thread(target=reporter._run, name="ddptop-reporter", daemon=True)
        reporter._thread.start()
    elif not on and thread is not None and thread.is_alive():
        global _retired_cpu_s
        _retired_cpu_s = reporter_cpu_s()  # the next thread's counter starts at zero
        reporter._stop.set()
        thread.join()
        timer = reporter.collectives.timer  # the enqueue timer's bursts are the reporter's too (#57)
        if timer is not None:
            timer.stop()
            reporter.collectives.timer = None  # the next sample starts a new one


_retired_cpu_s = 0.0  # CPU of reporter threads stopped by set_sampling


def last_sample_cost() -> float:
    """CPU time of the reporter's latest sample (thread_time around sample(); 0 without one)."""
    from ddptop.reporter import current

    stats = getattr(current(), "stats", None)
    return float(getattr(stats, "sample_cost_s", 0.0))


def sample_counts() -> tuple[int, int]:
    """(samples taken, full Flight Recorder dumps read) by this rank's reporter so far."""
    from ddptop.reporter import current

    reporter = current()
    stats = getattr(reporter, "stats", None)
    tracker = getattr(reporter, "collectives", None)
    return int(getattr(stats, "samples", 0)), int(getattr(tracker, "full_reads", 0))


def fr_reads() -> list[int]:
    """[status-only, full] Flight Recorder dumps this rank's reporter made."""
    from ddptop.reporter import current

    tracker = getattr(current(), "collectives", None)
    return [int(getattr(tracker, "status_reads", 0)), int(getattr(tracker, "full_reads", 0))]


def reporter_cpu_s() -> float:
    """CPU seconds the ddptop reporter thread of this process used so far (0.0 without one).

    Read from ``/proc/self/task/<tid>/schedstat`` (nanoseconds, cumulative), because
    ``thread_time`` can only be read by the thread itself and the per-thread tick
    counters are 10 ms coarse: far too coarse for a sample that costs ~0.1 ms.
    """
    from ddptop.reporter import current

    thread = getattr(current(), "_thread", None)
    tid = getattr(thread, "native_id", None)
    if tid is None or thread is None or not thread.is_alive():
        return _retired_cpu_s
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return _retired_cpu_s + int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return _retired_cpu_s


def run_job(with_reporter: bool, nproc: int, steps: int, warmup: int,
            runtime_dir: str) -> tuple[float, float, float, float]:
    """Run one job; rank 0's median step wall time, CPU per step, reporter CPU per step (s),
    and the reporter's CPU before the timed steps (its one-off start-up, s)."""
    result = run_job_raw(with_reporter, nproc, steps, warmup, runtime_dir)
    return (float(result["median"]), float(result["cpu"]), float(result["reporter_cpu"]),
            float(result.get("reporter_cpu_startup", 0.0)))


def run_job_raw(with_reporter: bool, nproc: int, steps: int, warmup: int, runtime_dir: str,
                block: int = 0, groups: int = 1) -> dict[str, Any]:
    """Run one job; rank 0's result line as a dict."""
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc),
                str(Path(__file__).resolve()), "--steps", str(steps), "--warmup", str(warmup),
                "--block", str(block), "--groups", str(groups)]
    env = dict(os.environ, OMP_NUM_THREADS="1", DDPTOP_RUNTIME_DIR=runtime_dir)
    env.pop("DDPTOP_DISABLE", None)
    cmd = [sys.executable, "-m", "ddptop", "launch", "--", *torchrun] if with_reporter else torchrun
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False,
                         cwd=ROOT)
    for line in res.stdout.splitlines():
        if line.startswith(MARK):
            result: dict[str, Any] = json.loads(line[len(MARK):])
            return result
    raise RuntimeError(f"job failed (rc {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")


# ---------------------------------------------------------------- microbenchmarks


def best_of(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """Best per-call time in seconds over *repeat* runs of *number* calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def ab(fn_a: Callable[[], Any], fn_b: Callable[[], Any], number: int, rounds: int) -> tuple[float, float]:
    """Per-call best times of A and B, measured in alternation."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(best_of(fn_a, number, 1))
        b.append(best_of(fn_b, number, 1))
    return min(a), min(b)


def micro(number: int, rounds: int) -> list[tuple[str, float, float]]:
    """(name, original us, patched us) rows for the hot-path hooks."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader, Sampler
    from torch.utils.data import dataloader as dl

    from ddptop.reporter import loaders, progress

    rows: list[tuple[str, float, float]] = []
    p = progress.PROGRESS
    # The hooks mirror their counters into the rank's progress page (a shared file mapping)
    # as they do inside a rank: attach a real one, not the private fallback.
    attach = getattr(p, "attach_page", None)
    if attach is not None:
        from ddptop.store.progress_page import ProgressPage

        page_dir = tempfile.mkdtemp(prefix="ddptop-bench-page-")
        attach(ProgressPage.create(Path(page_dir) / "bench.0.page", 0, time.time() - time.perf_counter()))
    base = dl._BaseDataLoaderIter
    assert not getattr(base, "_ddptop_patched", False), "run the bench outside ddptop launch"

    # (a) The wrapper alone, around a no-op __next__, on an iterator that has its loader's
    # record (the worst case: every batch of every tracked loader takes this path).
    class Fake:
        _num_yielded = 0
        _ddptop_rec = loaders.LoaderRecord(0, DataLoader([1.0]))

    def noop(self: Any) -> Any:
        return None

    wrapped_noop = loaders.make_next(noop, p)
    fake = Fake()
    a, b = ab(lambda: noop(fake), lambda: wrapped_noop(fake), number, rounds)
    rows.append(("DataLoader __next__ hook alone (around a no-op)", a * 1e6, b * 1e6))

    # (b) A real single-process iterator: original vs patched __next__.
    class Forever(Sampler[int]):
        def __init__(self) -> None:
            pass

        def __iter__(self) -> Any:
            while True:
                yield 0

    loader = DataLoader([1.0], batch_size=None, sampler=Forever())
    it = iter(loader)
    loaders.start_pass(p, loader, it)  # what the patched DataLoader.__iter__ does
    original_next = base.__next__
    patched_next = loaders.make_next(original_next, p)
    a, b = ab(lambda: original_next(it), lambda: patched_next(it), number // 4, rounds)
    rows.append(("DataLoader __next__, real iterator (batch_size=None)", a * 1e6, b * 1e6))

    # (c) The optimizer step post hook: a direct call, then opt.step() with vs without it.
    param = torch.zeros(1, requires_grad=True)
    param.grad = torch.zeros(1)
    opt = torch.optim.SGD([param], lr=0.0)
    p.optimizer_id, p.batch_seq = id(opt), 0  # a loop without loaders: counted by optimizer
    a, b = ab(lambda: None, lambda: progress._optimizer_post_hook(opt, (), {}), number, rounds)
    rows.append(("optimizer post hook alone (direct call vs no-op)", a * 1e6, b * 1e6))
    without: list[float] = []
    with_hook: list[float] = []
    for _ in range(rounds):
        without.append(best_of(opt.step, number // 20, 1))
        handle = register_optimizer_step_post_hook(progress._optimizer_post_hook)
        with_hook.append(best_of(opt.step, number // 20, 1))
        handle.remove()
    rows.append(("SGD.step() on 1 param, without vs with the hook", min(without) * 1e6,
                 min(with_hook) * 1e6))
    return rows


def in_job_ab(nproc: int, block: int, blocks: int, jobs: int, warmup: int, groups: int = 1) -> dict[str, Any]:
    """Print the in-job A/B: blocks of *block* steps with the sampling thread off, then on.

    Every block is compared with its neighbours of the other kind in the same processes,
    so between-job noise (placement, memory layout, other tenants) cancels out.
    """
    offs: list[float] = []
    ons: list[float] = []
    pair_ratios: list[float] = []
    gil: list[float] = []
    worst = worst_light = 0.0
    fr = [0, 0]
    with tempfile.TemporaryDirectory(prefix="ddptop-bench-") as rt:
        for j in range(jobs):
            result = run_job_raw(True, nproc, block * blocks, warmup, rt, block=block, groups=groups)
            if result.get("reporter_cpu_per_s") is not None:
                gil.append(float(result["reporter_cpu_per_s"]))
            worst = max(worst, float(result.get("worst_sample_s", 0.0)))
            worst_light = max(worst_light, float(result.get("worst_light_sample_s", 0.0)))
            fr = [a + b for a, b in zip(fr, result.get("fr", [0, 0]), strict=True)]
            seq = [(bool(on), float(med)) for on, med in result["blocks"]]
            for (on_a, a), (on_b, b) in itertools.pairwise(seq):
                if on_a != on_b:  # every off/on neighbour pair, both orders
                    pair_ratios.append((b / a) if on_b else (a / b))
            offs += [m for on, m in seq if not on]
            ons += [m for on, m in seq if on]
            print(f"  job {j + 1}: block medians (ms) " + " ".join(
                f"{'on' if on else 'off'}:{m * 1e3:.3f}" for on, m in seq), flush=True)
    ratio = statistics.median(pair_ratios)
    pair_ratios.sort()
    lo, hi = pair_ratios[len(pair_ratios) // 4], pair_ratios[(3 * len(pair_ratios)) // 4]
    print()
    print(f"## in-job A/B: reporter sampling thread off/on in blocks of {block} steps, "
          f"{blocks} blocks x {jobs} jobs, {nproc} ranks, {groups} process group(s)")
    print("| | median step ms | |")
    print("|---|---:|---|")
    print(f"| sampling off | {statistics.median(offs) * 1e3:.3f} | hooks installed |")
    print(f"| sampling on | {statistics.median(ons) * 1e3:.3f} | |")
    print(f"| on/off, median of {len(pair_ratios)} neighbour pairs | {ratio:.4f} "
          f"({(ratio - 1) * 100:+.2f} %) | interquartile {lo:.4f}..{hi:.4f}; target <= +0.5 % |")
    print()
    return {"groups": groups, "ratio": ratio, "lo": lo, "hi": hi,
            "gil_ms_per_s": statistics.median(gil) * 1e3 if gil else float("nan"),
            "worst_sample_ms": worst * 1e3,
            "worst_light_ms": worst_light * 1e3, "fr": fr, "jobs": jobs}


def print_groups_table(rows: list[dict[str, Any]], nproc: int, block: int) -> None:
    """The in-job A/B and the reporter's GIL time per second, by number of process groups."""
    print(f"## reporter cost by process groups (in-job A/B, {nproc} ranks, blocks of {block} steps; "
          "4 groups = default + 2 busy + 1 idle)")
    print("| process groups | step time on/off | interquartile | reporter GIL ms per s "
          "| longest sample ms | longest without a full FR dump ms "
          "| FR dumps status/full (rank 0, all jobs) |")
    print("|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['groups']} | {r['ratio']:.4f} ({(r['ratio'] - 1) * 100:+.2f} %) | "
              f"{r['lo']:.4f}..{r['hi']:.4f} | {r['gil_ms_per_s']:.3f} | {r['worst_sample_ms']:.2f} | "
              f"{r['worst_light_ms']:.2f} | "
              f"{r['fr'][0]}/{r['fr'][1]} |")
    print("GIL ms per s: CPU time of the reporter thread per wall second while it samples, read from "
          "/proc/self/task/<tid>/schedstat\n(Python code runs only with the GIL held, so this bounds the "
          "GIL time from above, whatever sys.getswitchinterval() is);\nlongest sample: thread_time() of "
          "the costliest single sample() seen by the training thread;\nthe longest is a full "
          "Flight Recorder dump "
          "(torch serialises up to 2000 entries with the GIL held: the training thread waits for it; "
          "at most\nFR_FULL_READS_PER_MIN a minute, a timing read every DDPTOP_FR_TIMING s); the next column "
          "is the longest sample after the warm-up that read none.")
    print()


# ---------------------------------------------------------------- main


def main() -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="A/B job pairs (default 4)")
    parser.add_argument("--steps", type=int, default=1000, help="timed steps per job")
    parser.add_argument("--warmup", type=int, default=800,
                        help="untimed steps per job (default ~2 s: past the reporter's one-off start-up)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--number", type=int, default=200_000, help="calls per microbenchmark run")
    parser.add_argument("--skip-jobs", action="store_true", help="microbenchmarks only")
    parser.add_argument("--block", type=int, default=400,
                        help="in-job A/B: steps per block of reporter sampling off/on (0: skip)")
    parser.add_argument("--blocks", type=int, default=12, help="in-job A/B: blocks per job")
    parser.add_argument("--block-jobs", type=int, default=2, help="in-job A/B: jobs")
    parser.add_argument("--groups", default="1,4",
                        help="in-job A/B: process group counts to run, comma-separated (default 1,4)")
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.steps, args.warmup, args.block, int(str(args.groups).split(",")[0]))
        return 0

    print(f"# reporter overhead  (python {sys.version.split()[0]}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f})")
    if not args.skip_jobs:
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        reporter_cpu: list[float] = []
        reporter_startup: list[float] = []
        with tempfile.TemporaryDirectory(prefix="ddptop-bench-") as rt:
            for i in range(args.rounds):
                # Alternate which variant goes first so slow drift does not favour one.
                order = (False, True) if i % 2 == 0 else (True, False)
                for with_reporter in order:
                    wall, cpu, rep, startup = run_job(with_reporter, args.nproc, args.steps, args.warmup, rt)
                    runs[with_reporter].append((wall, cpu))
                    if with_reporter:
                        reporter_cpu.append(rep)
                        reporter_startup.append(startup)
                    print(f"  round {i + 1} {'with   ' if with_reporter else 'without'} reporter: "
                          f"median step {wall * 1e3:8.3f} ms, cpu/step {cpu * 1e3:8.3f} ms", flush=True)
        print()
        print(f"## step time, DDP gloo CPU, {args.nproc} ranks, {args.steps} steps x {args.rounds} "
              "rounds (A/B interleaved, medians over rounds)")
        print("| variant | wall ms/step | CPU ms/step (all threads) | per-round wall ms |")
        print("|---|---:|---:|---|")
        med: dict[bool, tuple[float, float]] = {}
        for with_reporter in (False, True):
            walls = [w for w, _ in runs[with_reporter]]
            cpus = [c for _, c in runs[with_reporter]]
            med[with_reporter] = (statistics.median(walls), statistics.median(cpus))
            label = "with" if with_reporter else "without"
            wall, cpu = med[with_reporter]
            print(f"| {label} reporter | {wall * 1e3:.3f} | {cpu * 1e3:.3f} | "
                  f"{', '.join(f'{w * 1e3:.2f}' for w in walls)} |")
        wall_ratio = med[True][0] / med[False][0]
        cpu_ratio = med[True][1] / med[False][1]
        print(f"| ratio with/without | {wall_ratio:.4f} ({(wall_ratio - 1) * 100:+.2f} %) | "
              f"{cpu_ratio:.4f} ({(cpu_ratio - 1) * 100:+.2f} %) | target <= +0.5 % |")
        rep_step = statistics.median(reporter_cpu)
        print(f"| reporter thread CPU per step | | {rep_step * 1e6:.2f} us "
              f"({rep_step / med[False][1] * 100:.3f} % of a step's CPU) | measured in the B jobs |")
        print(f"| reporter start-up CPU, once (first {args.warmup} steps) | | "
              f"{statistics.median(reporter_startup) * 1e3:.1f} ms | not in the step times |")
        print()
        print("(wall and CPU ratios include the noise of a shared machine: compare the spread of "
              "per-round values;\n the reporter thread's own CPU and the hook costs below are the "
              "noise-free part of the overhead)")
        print()
    if args.block:
        counts = [int(g) for g in str(args.groups).split(",") if g.strip()]
        table = [in_job_ab(args.nproc, args.block, args.blocks, args.block_jobs, args.warmup, g)
                 for g in counts]
        print_groups_table(table, args.nproc, args.block)
    rows = micro(args.number, rounds=9)
    print("## added cost on the training thread (best of 9 interleaved runs)")
    print("| hot path | original (us) | with ddptop (us) | added (us) |")
    print("|---|---:|---:|---:|")
    for name, a, b in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
    print("target: <= 1 us added per batch and per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
