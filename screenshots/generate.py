"""Produce the dashboard screenshots of the README and docs/dashboard.md from real runs (SVG, headless).

Runs a healthy 4-rank CPU job and the F5 unseeded-split job under ``ddptop launch``, opens
the dashboard headless on each, and saves::

    screenshots/healthy.svg   every rank in step
    screenshots/desynced.svg  unequal batches, then the collective mismatch at the save
    screenshots/stacks.svg    `s` on the desynced job: stacks grouped across ranks
    screenshots/detail.svg    Enter on the odd rank
    screenshots/replay.svg    a bundle of the desynced job replayed (if bundles exist)
    screenshots/postmortem.svg  `ddptop replay JOB` of a job that died: one rank skipped a
                              collective, a victim aborted, torchrun tore the rest down

Run from the repository root: ``.venv/bin/python screenshots/generate.py``. Every job runs
in its own process group in a private runtime dir and is killed on the way out; every
wait is bounded. Takes about two minutes on a small machine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "probes"
sys.path.insert(0, str(ROOT))

from textual.pilot import Pilot  # noqa: E402

from ddptop.cli.demo import start_job, stop_job, wait_for_ranks  # noqa: E402
from ddptop.client.live import LiveSource  # noqa: E402
from ddptop.client.targets import resolve  # noqa: E402
from ddptop.tui.app import DdptopApp  # noqa: E402
from ddptop.tui.screens.stacks import StacksScreen  # noqa: E402
from ddptop.tui.widgets.rank_table import RankTable  # noqa: E402

log = logging.getLogger("screenshots")
OUT = Path(__file__).resolve().parent
SIZE = (172, 45)


async def until(pilot: Pilot[int], cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded wait while the app runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.25)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def rows_status(app: DdptopApp) -> dict[int, str]:
    """Status of each row."""
    return {r.rank: r.status for r in app.query_one(RankTable).shown_rows}


def save(app: DdptopApp, name: str, title: str) -> None:
    """Write OUT/name.svg."""
    app.save_screenshot(f"{name}.svg", str(OUT))
    svg = OUT / f"{name}.svg"
    svg.write_text(svg.read_text().replace(">ddptop<", f">{title}<", 1))
    print(f"wrote {svg}", flush=True)


async def healthy(job_id: str) -> None:
    """healthy.svg: all ranks running with some history behind them."""
    app = DdptopApp(LiveSource(resolve(job_id)))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: set(rows_status(app).values()) == {"running"}
                    and len(rows_status(app)) == 4, 60, "4 running ranks")
        await pilot.pause(6)  # a few samples so steps/s and sparklines have data
        save(app, "healthy", "ddptop attach: healthy 4-rank job")


def _mismatch(app: DdptopApp) -> bool:
    return any("MISMATCH" in r.marks for r in app.query_one(RankTable).shown_rows)


async def desynced(job_id: str) -> None:
    """desynced.svg, stacks.svg, detail.svg from the unseeded-split job."""
    app = DdptopApp(LiveSource(resolve(job_id)))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: _mismatch(app), 150, "the collective mismatch")
        await pilot.pause(2)
        save(app, "desynced", "ddptop attach: unseeded split (F5) desyncs at checkpoint save")
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen.result is not None,
                    20, "stacks")
        await pilot.pause(0.5)
        save(app, "stacks", "ddptop: s groups identical stacks across ranks")
        await pilot.press("escape")
        table = app.query_one(RankTable)
        odd = next(i for i, r in enumerate(table.shown_rows) if "MISMATCH" in r.marks)
        table.cursor = odd
        await pilot.press("enter")
        await pilot.pause(1)
        save(app, "detail", f"ddptop: rank {table.shown_rows[odd].rank} detail")
        await pilot.press("escape")


def export_bundle_of(job_id: str, path: Path) -> bool:
    """Export the live job to a bundle; False when the bundle package is missing."""
    try:
        from ddptop.client.capture import export_bundle
    except ImportError:
        return False
    print(export_bundle(resolve(job_id), path).line(), flush=True)
    return True


async def replay(path: Path) -> None:
    """replay.svg: the bundle in the dashboard, at its last moment (every rank reported)."""
    from ddptop.bundle.replay_source import ReplaySource

    app = DdptopApp(ReplaySource(path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(1.5)
        save(app, "replay", "ddptop replay: the exported bundle")


async def postmortem(job_id: str) -> None:
    """postmortem.svg: the black box of a dead job, replayed at its end (root cause first)."""
    from ddptop.bundle.replay_source import ReplaySource

    app = DdptopApp(ReplaySource(resolve(job_id).record or Path(job_id)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(1.5)
        save(app, "postmortem", f"ddptop replay {job_id}: the record of a job that died")


def main() -> int:
    """Run the jobs one after the other; always kill them. Arguments: only these groups of
    shots ("live": healthy, desynced, stacks, detail, replay; "postmortem"); default all."""
    wanted = set(sys.argv[1:]) or {"live", "postmortem"}
    rt = Path(tempfile.mkdtemp(prefix="ddptop-shots-"))
    rt.chmod(0o700)
    os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
    os.environ.setdefault("PROBE_STEP_SLEEP", "0.05")
    if "live" in wanted:
        live_shots(rt)
    if "postmortem" in wanted:
        job_id, proc = start_job(PROBES / "skipped_collective.py", 120, rt / "skipped.log")
        try:
            proc.wait(timeout=180)  # it dies by itself: the point is what it leaves behind
        finally:
            stop_job(proc)
        asyncio.run(postmortem(job_id))
    return 0


def live_shots(rt: Path) -> None:
    """The shots of live jobs, and the replay of a bundle exported from one."""
    job_id, proc = start_job(PROBES / "healthy.py", 90, rt / "healthy.log")
    try:
        wait_for_ranks(job_id, proc, 120, rt / "healthy.log")
        asyncio.run(healthy(job_id))
    finally:
        stop_job(proc)
    os.environ["PROBE_PG_TIMEOUT"] = "120"  # keep the hang alive while we take pictures
    job_id, proc = start_job(PROBES / "unseeded_split.py", 240, rt / "split.log")
    bundle = rt / "desynced.ddptop"
    have_bundle = False
    try:
        wait_for_ranks(job_id, proc, 120, rt / "split.log")
        asyncio.run(desynced(job_id))
        have_bundle = export_bundle_of(job_id, bundle)
    finally:
        stop_job(proc)
    if have_bundle:
        asyncio.run(replay(bundle))


if __name__ == "__main__":
    sys.exit(main())
