"""What the whole dashboard costs while it watches a big job: CPU per second, thread by thread.

Run: ``.venv/bin/python bench/dashboard_cpu.py [--ranks 4096,32768] [--seconds 60]
[--via digest,agent] [--late hang|silent]``.

``bench/tui_scale.py`` times the parts (ingest, a redraw it forces, keys it sends). This bench
leaves the real ``DdptopApp`` alone (headless, ``run_test(size=(200, 60))``, a LiveSource
injected): its own timer redraws, its own diagnosis runs as often as it decides. Once every
rank is in and ``--settle`` seconds passed, for ``--seconds`` seconds we count this process's
CPU (``time.process_time``) and split it:

* **UI**: the main thread (Textual's loop: drains the source's buffer into the model, redraws,
  copies the model for a background diagnosis), less any diagnosis it ran itself;
* **live**: the LiveSource's thread (``ddptop-live``: sockets, decoding), from
  ``/proc/self/task/TID/stat``;
* **diagnosis**: ``time.thread_time`` around every ``findings`` call, on whichever thread (a
  worker thread from 1,024 ranks: ``ddptop.tui.app``), with how many ran and their wall time;
* **other**: the rest (the cyclic collector's pauses land in whichever thread triggered
  them; Textual's and asyncio's helper threads).

``--late hang`` measures, instead, how late the dashboard names a hang: a job of its own per
size (scenario ``hang``, once the viewer is in), from the moment the peers' wait reaches
``stall_s`` to the app showing the ``collective_stall`` finding that names the rank that never
entered. ``--late silent``: a rank that stops sending, from its last state to the app showing
``rank_unresponsive`` naming it. The diagnosis runs at the app's own pace (at 32,768 ranks
every few seconds).

The synthetic job runs in a subprocess (its CPU is not counted here). Ways in ``--via`` are
alternated size by size (A/B, then B/A). Timings on a shared 2-core machine are noisy: run it
alone for numbers you quote.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT), str(_ROOT / "bench")]

from tui_scale import every_rank_in, generator_args, runnable

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.testing.synthetic import ensure_fd_limit, run_in_subprocess

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(native_id: int) -> float:
    """User plus system CPU seconds of one thread of this process (0.0 once it is gone)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: stat fields 14 and 15


def live_thread() -> threading.Thread | None:
    """The LiveSource's reading thread."""
    return next((t for t in threading.enumerate() if t.name == "ddptop-live"), None)


class DiagnosisClock:
    """Wraps the app's ``findings``: CPU and wall time of every diagnosis, and where it ran."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.cpu_s = self.wall_s = self.on_ui_s = 0.0
        self.runs = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.monotonic()
        try:
            return self.inner(*args, **kwargs)
        finally:
            spent = time.thread_time() - cpu
            self.cpu_s += spent
            self.wall_s += time.monotonic() - wall
            self.runs += 1
            if threading.current_thread() is threading.main_thread():
                self.on_ui_s += spent


@contextmanager
def clocked_findings() -> Iterator[DiagnosisClock]:
    """The app's ``findings`` wrapped by a :class:`DiagnosisClock` for the block."""
    import ddptop.tui.app as app_module

    clock = DiagnosisClock(app_module.findings)
    app_module.findings = clock  # type: ignore[assignment]
    try:
        yield clock
    finally:
        app_module.findings = clock.inner  # type: ignore[assignment]


async def watch(job_id: str, n: int, digest: bool, settle_s: float, seconds: float) -> dict[str, float]:
    """The real app watching *job_id*; this process's CPU over *seconds*, by thread."""
    from ddptop.tui.app import DdptopApp

    with clocked_findings() as clock:
        app = DdptopApp(LiveSource(resolve(job_id), digest=digest))
        async with app.run_test(size=(200, 60)) as pilot:
            await every_rank_in(app, pilot, n)
            await pilot.pause(settle_s)
            live = live_thread()
            if live is None or live.native_id is None:
                raise RuntimeError("no ddptop-live thread")
            cpu0, ui0, live0 = time.process_time(), time.thread_time(), thread_cpu_s(live.native_id)
            d_cpu0, d_ui0, d_wall0, runs0 = clock.cpu_s, clock.on_ui_s, clock.wall_s, clock.runs
            wall0 = time.monotonic()
            await pilot.pause(seconds)
            wall = time.monotonic() - wall0
            total, ui = time.process_time() - cpu0, time.thread_time() - ui0
            live_s = thread_cpu_s(live.native_id) - live0
            diag, runs = clock.cpu_s - d_cpu0, clock.runs - runs0
            ui -= clock.on_ui_s - d_ui0
            mean_wall = (clock.wall_s - d_wall0) / runs if runs else 0.0

    def per_s(x: float) -> float:
        return 1000 * x / wall

    return {"total": per_s(total), "ui": per_s(ui), "live": per_s(live_s), "diagnosis": per_s(diag),
            "other": per_s(total - ui - live_s - diag), "runs": float(runs), "mean_wall_s": mean_wall}


# What each scenario's finding is, and what its lateness counts from: a stall counts once the
# peers waited stall_s (the finding's since is when they began); a silent rank's finding's
# since is its last state.
LATE = {"hang": ("collective_stall", True), "silent": ("rank_unresponsive", False)}


async def time_to_finding(job_id: str, n: int, odd: int, digest: bool, limit_s: float,
                          scenario: str) -> dict[str, float]:
    """The real app watching a job that goes wrong (scenario ``hang``: every rank but *odd*
    waits in a collective *odd* never enters; ``silent``: *odd* stops sending): seconds from
    the moment it counts (``LATE``) to the app showing the finding that names *odd*, and how
    many diagnoses ran (since the attach) and how long each took."""
    from ddptop.diagnosis.config import DiagnosisConfig
    from ddptop.tui.app import DdptopApp

    kind, after_stall = LATE[scenario]
    after_s = DiagnosisConfig().stall_s if after_stall else 0.0
    with clocked_findings() as clock:
        app = DdptopApp(LiveSource(resolve(job_id), digest=digest))
        async with app.run_test(size=(200, 60)) as pilot:
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                for f in app.findings:
                    if f.kind == kind and odd in f.ranks and f.since is not None:
                        return {"late_s": time.time() - (f.since + after_s), "runs": float(clock.runs),
                                "mean_wall_s": clock.wall_s / max(1, clock.runs)}
                await pilot.pause(0.1)
            return {}


def late_rows(sizes: list[int], ways: list[str], scenario: str) -> list[tuple[int, str, dict[str, float]]]:
    """For each size and way, a job of its own that goes wrong (*scenario*) once the viewer is in."""
    from ddptop.testing.synthetic_ranks import FakeRanks

    rows = []
    for n in sizes:
        extra = generator_args(n, ways)
        for via in ways:
            if extra is None or not runnable(via, extra):
                rows.append((n, via, {}))
                continue
            rt = Path(tempfile.mkdtemp(prefix="ddptop-hang-"))
            os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
            job_id, quiet_after = f"{scenario}{n}", 30.0 + n / 512  # time to start and attach first
            odd = FakeRanks(n, job_id, scenario, 1.0, 0.0).odd_rank
            gen = run_in_subprocess(n, job_id, scenario, 1.0, rt, ready_timeout=600,
                                    extra_args=(*extra, "--desync-after", str(quiet_after)))
            try:
                ensure_fd_limit((n if via == "ranks" else n // 8) + 512)
                os.environ["DDPTOP_VIA"] = "ranks" if via == "ranks" else "agent"
                rows.append((n, via, asyncio.run(time_to_finding(job_id, n, odd, via == "digest",
                                                                 quiet_after + 120, scenario))))
            finally:
                gen.stop()
        print(f"  {scenario} done {n} ranks", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    """Every size, every way, then the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="4096,32768")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after every rank is in")
    parser.add_argument("--late", choices=sorted(LATE),
                        help="instead: how late the dashboard names a hang or a silent rank (own jobs)")
    parser.add_argument("--via", default="digest",
                        help="digest, agent or ranks, comma-separated (alternated)")
    args = parser.parse_args()
    ways = args.via.split(",")
    if args.late:
        print(f"{'ranks':>6} {'via':>7} {'finding late s':>14} {'diagnoses':>9} {'each s':>6}")
        for n, via, r in late_rows([int(x) for x in args.ranks.split(",")], ways, args.late):
            late = f"{r['late_s']:.1f}" if r else "n/a"
            runs, each = (f"{r['runs']:.0f}", f"{r['mean_wall_s']:.2f}") if r else ("n/a", "n/a")
            print(f"{n:>6} {via:>7} {late:>14} {runs:>9} {each:>6}")
        print("finding late: seconds to the app showing " + ("collective_stall naming the rank that never "
              "entered, from the peers' wait reaching stall_s (5 s)" if args.late == "hang" else
              "rank_unresponsive naming the silent rank, from its last state"))
        return 0
    rows: list[tuple[int, str, dict[str, float]]] = []
    for index, n in enumerate(int(x) for x in args.ranks.split(",")):
        extra = generator_args(n, ways)
        if extra is None:
            rows += [(n, via, {}) for via in ways]
            continue
        rt = Path(tempfile.mkdtemp(prefix="ddptop-cpu-"))
        os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
        gen = run_in_subprocess(n, f"cpu{n}", "healthy", 1.0, rt, extra_args=extra, ready_timeout=600)
        try:
            for via in ways if index % 2 == 0 else ways[::-1]:
                if not runnable(via, extra):
                    rows.append((n, via, {}))
                    continue
                ensure_fd_limit((n if via == "ranks" else n // 8) + 512)
                os.environ["DDPTOP_VIA"] = "ranks" if via == "ranks" else "agent"
                rows.append((n, via, asyncio.run(watch(f"cpu{n}", n, via == "digest", args.settle,
                                                       args.seconds))))
        finally:
            gen.stop()
        print(f"  done {n} ranks", file=sys.stderr, flush=True)
    head = (f"{'ranks':>6} {'via':>7} {'total ms/s':>10} {'UI':>6} {'live':>6} {'diagnosis':>9} "
            f"{'other':>6} {'diagnoses':>9} {'each s':>6}")
    print(head)
    print("-" * len(head))
    for n, via, r in rows:
        def f(key: str, digits: int = 0, r: dict[str, float] = r) -> str:
            return f"{r[key]:.{digits}f}" if key in r else "n/a"

        print(f"{n:>6} {via:>7} {f('total'):>10} {f('ui'):>6} {f('live'):>6} {f('diagnosis'):>9} "
              f"{f('other'):>6} {f('runs'):>9} {f('mean_wall_s', 2):>6}")
    print(f"over {args.seconds:.0f} s of the live dashboard, {args.settle:.0f} s after every rank was in; "
          "ms of CPU per second (1000 = one core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
