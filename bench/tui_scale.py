"""Dashboard scale benchmark: ingest CPU, rank-table redraw and key latency, 64 to 32,768 ranks.

Run: ``.venv/bin/python bench/tui_scale.py [--ranks 64,1024,4096] [--window 6]``; the sizes of
issue 23 are ``--ranks 4096,8192,16384,32768 --via ranks,agent``.

For each size a synthetic job (``ddptop.testing.synthetic``, 1 s sample interval, real sockets)
runs in a SUBPROCESS, so its CPU is not counted here. Then:

* ingest: a LiveSource feeds a JobModel (``apply`` in the emit callback, as the app's
  buffer drain does) for ``--window`` seconds; we report this process's CPU time per
  wall second (only the LiveSource thread works; the main thread sleeps) and the part of
  it spent in ``JobModel.apply`` (``time.thread_time`` around each call).
* redraw (if ``ddptop.tui.app`` exists): the real ``DdptopApp`` headless
  (``run_test(size=(200, 60))``) with a LiveSource injected, redrawn at the timer's cadence
  (one ``redraw_period()`` of live events between redraws, the diagnosis running in its
  background thread as usual). ``update`` = the app's own ``redraw()`` (rows, findings,
  header); ``paint`` = ``render_line`` of every visible line of the rank table from an empty
  cache, its group rows summed again (a group of 32,768 ranks is summed when painted);
  ``cycle`` = ``redraw()`` then until every queued message is handled and the screen repainted:
  the figure compared with the 50 ms target (median of 9).
* keys: p95 of key event sent -> handled and the screen repainted, for cursor moves with a sort change (``>``)
  every fifth press; target 100 ms.

``--via ranks,agent`` measures both ways a viewer reaches the ranks, alternating, on one
generator that also serves every 8 ranks through a node-agent endpoint (``DDPTOP_VIA``):
one connection per rank, or one per node agent. Where a socket per rank does not fit the
open-files hard limit (about 9,000 ranks here: ``fds_needed``), the generator runs agents only
(``--agents-only``) and the ``ranks`` row says n/a.

``--busy`` runs every way twice on one generator, on an idle node and on a busy one
(``bench/busy_node.py``: this viewer pinned to one core, the generator and a nice-19 CPU
burner on the other, so that core is fully busy while the generator keeps its pace),
alternating which goes first; the table prints both, with the generator's and the burner's
CPU (percent of a core) and the events per second the viewer received (on the digest lane,
the ranks' states that reached it: each pulse, and the samples it carried from before it).

Timings on a shared 2-core machine are noisy; run it alone for numbers you quote.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.busy_node import node
from ddptop.client.collector import ViewerCollector
from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.digest import PulseBatch
from ddptop.model.job import JobModel
from ddptop.protocol import Event
from ddptop.testing.synthetic import SyntheticProcess, ensure_fd_limit, fds_needed, run_in_subprocess
from ddptop.testing.synthetic_ranks import FakeRanks

REDRAW_TARGET_MS, KEY_TARGET_MS = 50.0, 100.0
INGEST_TARGET_MS, ATTACH_TARGET_S, SILENT_TARGET_S = 250.0, 3.0, 5.0


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Poll until *predicate()*; RuntimeError after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def measure_ingest(job_id: str, n: int, window: float, digest: bool = False,
                   old_gc: bool = False) -> dict[str, float]:
    """CPU per second of LiveSource + JobModel.apply over *window* seconds of steady state, the
    garbage collector as the dashboard keeps it (*old_gc*: as before the attach held it off)."""
    model, lock = JobModel(), threading.Lock()
    counters = {"events": 0, "apply_s": 0.0}

    def emit(event: Event) -> None:
        began = time.thread_time()
        with lock:
            model.apply(event)
        counters["apply_s"] += time.thread_time() - began
        counters["events"] += 1

    def pulses(batch: PulseBatch) -> None:  # the digest lane: one batch per node digest
        began = time.thread_time()
        with lock:
            model.apply(batch)
        counters["apply_s"] += time.thread_time() - began
        # States received: each pulse is its rank's newest, and carries the samples before it
        # (a digest of a job of 16,384 ranks or more spans two samples: agent/digest.py).
        counters["events"] += len(batch.pulses) + sum(len(p.earlier) for p in batch.pulses)

    source = LiveSource(resolve(job_id), digest=digest)
    collector = ViewerCollector(hold=not old_gc, freeze=not old_gc)
    attach_began, attach_cpu = time.monotonic(), time.process_time()
    collector.start()
    source.start(emit, pulses=pulses)
    try:
        def all_in() -> bool:
            with lock:
                return sum(1 for v in model.ranks.values() if v.base is not None) >= n

        wait_for(all_in, 90 + n / 256, f"state from {n} ranks")  # 32,768 ranks: 218 s
        attach_s, attach_cpu = time.monotonic() - attach_began, time.process_time() - attach_cpu
        with lock:
            collector.attached(n, settled=True)  # its one full collection: release_s
        time.sleep(1.5)  # let history replies and connect bursts pass: measure the steady stream
        ev0, ap0, cpu0, wall0 = counters["events"], counters["apply_s"], time.process_time(), time.monotonic()
        time.sleep(window)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        return {"attach_s": attach_s, "attach_cpu_s": attach_cpu, "cpu_ms_per_s": 1000 * cpu / wall,
                "apply_ms_per_s": 1000 * (counters["apply_s"] - ap0) / wall,
                "events_per_s": (counters["events"] - ev0) / wall, "release_s": collector.release_s}
    finally:
        source.stop()
        collector.stop()


def measure_silent(n: int, via: str, extra: tuple[str, ...], mode: str = "idle") -> dict[str, float]:
    """A job whose odd rank stops sending (scenario ``silent``, after the viewer attached): how
    long after that rank's last state arrived the viewer's model calls it stale (the odd view
    lists stale ranks first). Its own generator, so the healthy measures above are untouched."""
    rt = Path(tempfile.mkdtemp(prefix="ddptop-silent-"))
    os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
    job_id, quiet_after = f"silent{n}", 45.0 + n / 512  # time to start and attach first
    odd = FakeRanks(n, job_id, "silent", 1.0, 0.0).odd_rank
    gen = run_in_subprocess(n, job_id, "silent", 1.0, rt, ready_timeout=600,
                            extra_args=(*extra, "--desync-after", str(quiet_after)))
    model, lock = JobModel(), threading.Lock()

    def emit(event: Event) -> None:
        with lock:
            model.apply(event)

    def pulses(batch: PulseBatch) -> None:
        with lock:
            model.apply(batch)

    with node(mode, gen.pid):
        source = LiveSource(resolve(job_id), digest=via == "digest")
        source.start(emit, pulses=pulses)
        try:
            deadline = time.monotonic() + quiet_after + 60
            while time.monotonic() < deadline:
                with lock:
                    view = model.ranks.get(odd)
                    if (view is not None and view.base is not None
                            and model.statuses(time.time())[odd] == "stale"):
                        return {"silent_named_s": time.time() - view.received_at}
                time.sleep(0.02)
            return {}
        finally:
            source.stop()
            gen.stop()


async def _tui(job_id: str, n: int, presses: int, digest: bool = False,
               old_gc: bool = False) -> dict[str, float]:
    from textual import events

    from ddptop.tui.app import DdptopApp
    from ddptop.tui.rows import GroupRow
    from ddptop.tui.widgets.rank_table import RankTable

    app = DdptopApp(LiveSource(resolve(job_id), digest=digest))
    if old_gc:
        app.collector = ViewerCollector(hold=False, freeze=False)
    async with app.run_test(size=(200, 60)) as pilot:
        table = app.query_one(RankTable)
        await every_rank_in(app, pilot, n)
        update, paint, cycle = [], [], []
        app.paused = True  # the timer stops redrawing: the bench redraws at the timer's cadence
        ui_cpu, ui_wall = time.thread_time(), time.monotonic()  # the UI thread's work, all of it
        for _ in range(9):
            # One redraw interval of live events arrives first, as between two timer redraws
            # (at 1 Hz samples and 2 redraws/s at 32,768 ranks, half of the ranks changed).
            await pilot.pause(app.redraw_period())
            began = time.perf_counter()
            app.redraw()
            drawn = time.perf_counter()
            await _painted(pilot)
            update.append(drawn - began)
            cycle.append(time.perf_counter() - began)
            table._styles_cache.clear()  # paint from scratch, not from the line cache
            for entry in getattr(table.shown_rows, "_entries", ()):
                if isinstance(entry, GroupRow):  # a group row is summed when painted: again
                    entry.status_counts = {}
            began = time.perf_counter()
            for y in range(table.size.height):
                table.render_line(y)
            paint.append(time.perf_counter() - began)
        ui_ms_per_s = 1000 * (time.thread_time() - ui_cpu) / (time.monotonic() - ui_wall)
        app.paused = False
        keys: list[float] = []
        sorts: list[float] = []
        moves: list[float] = []
        for i in range(presses):
            key = events.Key("greater_than_sign", ">") if i % 5 == 4 else events.Key("down", None)
            key.set_sender(app)
            began = time.perf_counter()
            # Not pilot.press (it sleeps until the process looks idle) nor the driver (it posts
            # from another task, so the key could land after our "all handled" marker).
            app.post_message(key)
            await _painted(pilot)
            keys.append(time.perf_counter() - began)
            (sorts if i % 5 == 4 else moves).append(keys[-1])
        await pilot.pause()
        if table.sort_key == "rank" or table.cursor == 0:  # the keys must really have been handled
            raise RuntimeError(f"keys had no effect (sort {table.sort_key}, cursor {table.cursor})")
    keys.sort()
    return {"update_ms": 1000 * statistics.median(update), "paint_ms": 1000 * statistics.median(paint),
            "cycle_ms": 1000 * statistics.median(cycle),
            "key_p95_ms": 1000 * keys[min(len(keys) - 1, int(0.95 * len(keys)))],
            "key_max_ms": 1000 * keys[-1], "rows": float(len(table.shown_rows)), "ui_ms_per_s": ui_ms_per_s,
            "sort_key_median_ms": 1000 * statistics.median(sorts) if sorts else 0.0,
            "move_key_median_ms": 1000 * statistics.median(moves) if moves else 0.0}


async def every_rank_in(app, pilot, n: int) -> None:  # type: ignore[no-untyped-def]
    """Until every rank's state is in the app's model (above 1,024 ranks the table shows the
    odd ones and groups, not a row per rank) and at least one row is drawn."""
    from ddptop.tui.widgets.rank_table import RankTable

    table = app.query_one(RankTable)
    deadline = time.monotonic() + 90 + n / 256
    while len(app.model.ranks) < n or any(r is None for r in _states(app)) or not len(table.shown_rows):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the app had {len(app.model.ranks)} of {n} ranks")
        await pilot.pause(0.2)


async def _painted(pilot) -> None:  # type: ignore[no-untyped-def]
    # Every message queued so far is handled, then the screen's pending repaint is done now.
    await pilot._wait_for_screen()
    pilot.app.screen._on_timer_update()


def _states(app) -> list[object]:  # type: ignore[no-untyped-def]
    return [v.base for v in app.model.ranks.values()]  # base: no merge of a waiting pulse


def tui_available() -> str:
    """'' when the Textual app and rank table import, else why not."""
    try:
        from ddptop.tui.app import DdptopApp  # noqa: F401
        from ddptop.tui.widgets.rank_table import RankTable  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def fits(needed: int) -> bool:
    """Whether *needed* open files fit under this process's hard limit (the generator's is the same)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard == resource.RLIM_INFINITY or needed <= hard


def ab_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every A/B script of the dashboard takes (bench/fold_slices_ab.py,
    bench/key_hold_ab.py): the job's size, the turns, the node."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ranks", type=int, default=32768)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--idle", action="store_true", help="an idle node instead of a busy one")
    return parser


def digest_job(n: int, job_id: str) -> SyntheticProcess:
    """The synthetic job an A/B runs on: *n* healthy ranks behind node agents that offer the
    digest lane, in a runtime directory of its own (the viewer goes through the agents)."""
    rt = Path(tempfile.mkdtemp(prefix="ddptop-ab-"))
    os.environ["DDPTOP_RUNTIME_DIR"], os.environ["DDPTOP_VIA"] = str(rt), "agent"
    ensure_fd_limit(n // 8 + 512)
    return run_in_subprocess(n, job_id, "healthy", 1.0, rt, ready_timeout=600,
                             extra_args=generator_args(n, ["digest"]) or ())


def generator_args(n: int, ways: list[str]) -> tuple[str, ...] | None:
    """The generator's flags for size *n*: ranks and agents if a socket per rank fits, agents only
    if not (None: the asked ways cannot run at all)."""
    per_agent = 8 if "agent" in ways or "digest" in ways else 0
    if fits(fds_needed(n, per_agent)) and fits(n + 512):  # generator, and this viewer's socket per rank
        return ("--ranks-per-agent", "8") if per_agent else ()
    return ("--agents-only",) if per_agent else None


def runnable(via: str, args: tuple[str, ...]) -> bool:
    """Whether a viewer can attach *via* to a generator started with *args*."""
    return via in ("agent", "digest") or "--agents-only" not in args


def main() -> int:
    """Run every size and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="64,1024,4096")
    parser.add_argument("--window", type=float, default=6.0,  # 16,384 ranks on: a digest spans 2 s
                        help="ingest measurement seconds (a multiple of 2)")
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--silent", action="store_true",
                        help="also time a rank that stops sending until it is called stale (own job)")
    parser.add_argument("--busy", action="store_true",
                        help="also measure on a busy node: this viewer on one core, the generator and a "
                             "CPU burner on the other (bench/busy_node.py); both are printed")
    parser.add_argument("--via", default="ranks",
                        help="ranks, agent (the agents' stream of states), digest (their digest lane), "
                             "comma-separated (alternated); a way+oldgc keeps the collector as before "
                             "the attach held it off (ddptop.client.collector)")
    args = parser.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    ways = args.via.split(",")
    modes = ["idle", "busy"] if args.busy else ["idle"]
    plain = [w.partition("+")[0] for w in ways]
    why_no_tui = tui_available()
    rows: list[tuple[int, str, str, float, dict[str, float], dict[str, float]]] = []
    for index, n in enumerate(sizes):
        extra = generator_args(n, plain)
        if extra is None:
            rows += [(n, via, mode, 0.0, {}, {}) for via in ways for mode in modes]
            continue
        rt = Path(tempfile.mkdtemp(prefix="ddptop-bench-"))
        os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
        job_id = f"bench{n}"
        began = time.monotonic()
        gen = run_in_subprocess(n, job_id, "healthy", 1.0, rt, extra_args=extra, ready_timeout=600)
        start_s = time.monotonic() - began
        # A/B, then B/A: ways alternate by size, the nodes by way.
        pairs = [(way, mode) for w, way in enumerate(ways if index % 2 == 0 else ways[::-1])
                 for mode in (modes if (index + w) % 2 == 0 else modes[::-1])]
        try:
            for way, mode in pairs:
                via, _, flag = way.partition("+")  # digest+oldgc: the collector as before
                old_gc = flag == "oldgc"
                if not runnable(via, extra):
                    rows.append((n, way, mode, start_s, {}, {}))  # a socket per rank does not fit: n/a
                    continue
                ensure_fd_limit((n if via == "ranks" else n // 8) + 512)  # this viewer's sockets
                os.environ["DDPTOP_VIA"] = "ranks" if via == "ranks" else "agent"
                digest = via == "digest"
                with node(mode, gen.pid) as where:
                    ingest = measure_ingest(job_id, n, args.window, digest, old_gc)
                    tui = asyncio.run(_tui(job_id, n, args.presses, digest, old_gc)) if not why_no_tui else {}
                ingest.update(where.usage)
                rows.append((n, way, mode, start_s, ingest, tui))
        finally:
            gen.stop()
        for row in rows[-len(pairs):] if args.silent else ():
            via = row[1].partition("+")[0]
            if runnable(via, extra):
                os.environ["DDPTOP_VIA"] = "ranks" if via == "ranks" else "agent"
                row[5].update(measure_silent(n, via, extra, row[2]))
        print(f"  done {n} ranks", file=sys.stderr, flush=True)
    head = (f"{'ranks':>6} {'via':>8} {'node':>5} {'gen CPU%':>8} {'burn CPU%':>9} {'gen start s':>11} "
            f"{'attach s':>8} {'(CPU)':>5} {'freeze s':>8} {'events/s':>8} "
            f"{'ingest CPU ms/s':>15} {'(apply)':>7} {'update ms':>9} {'paint ms':>8} {'redraw ms':>9} "
            f"{'key p95 ms':>10} {'key max':>7} {'UI ms/s':>7} {'silent named s':>14}")
    print(head)
    print("-" * len(head))
    for n, via, mode, start_s, ing, tui in sorted(rows, key=lambda r: (r[0], r[1], r[2] != "idle")):
        def f(key: str, t: dict[str, float] = tui, digits: int = 1) -> str:
            return f"{t[key]:.{digits}f}" if key in t else "n/a"

        start = f"{start_s:.1f}" if start_s else "n/a"
        print(f"{n:>6} {via:>8} {mode:>5} {f('generator_cpu_pct', ing, 0):>8} "
              f"{f('burner_cpu_pct', ing, 0):>9} {start:>11} {f('attach_s', ing):>8} "
              f"{f('attach_cpu_s', ing):>5} "
              f"{f('release_s', ing, 2):>8} {f('events_per_s', ing, 0):>8} "
              f"{f('cpu_ms_per_s', ing):>15} {f('apply_ms_per_s', ing):>7} {f('update_ms'):>9} "
              f"{f('paint_ms'):>8} {f('cycle_ms'):>9} {f('key_p95_ms'):>10} {f('key_max_ms'):>7} "
              f"{f('ui_ms_per_s'):>7} {f('silent_named_s', digits=2):>14}")
    print("n/a: that way cannot run at that size here (a socket per rank past the open-files limit)")
    print(f"targets: redraw <= {REDRAW_TARGET_MS:.0f} ms, key latency p95 <= {KEY_TARGET_MS:.0f} ms, "
          f"ingest <= {INGEST_TARGET_MS:.0f} ms/s, attach <= {ATTACH_TARGET_S:.0f} s, "
          f"a silent rank named within {SILENT_TARGET_S:.0f} s (32,768 ranks, idle or busy node)")
    if why_no_tui:
        print(f"redraw/keys n/a: the Textual app is not importable ({why_no_tui})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
