"""A/B of what keeps keys quick while a big job is diagnosed, keys at a person's pace, one run.

Run: ``.venv/bin/python bench/key_hold_ab.py [--what hold|copy] [--ranks 32768] [--turns 6] [--idle]``.

One synthetic job through the node agents' digest lane; the real app headless, a new attach
each turn, turns alternating A (today's) and B (as before), on a busy node unless ``--idle``
(``bench/busy_node.py``). ``--what hold`` (the default): A, a key holds the UI busy from its
arrival to its repaint (``TableActions.on_event``); B, only the key's action is a busy block.
``--what copy``: A, the background diagnosis's copy is taken a slice of ranks at a time, its
status index taken along (``tui/background_findings``, ``model/sliced_copy``); B, the copy is
taken whole in one message and its index built anew by the diagnosis. ``--what linger``: A, the
diagnosis waits on until 0.25 s after a person's key (at most two seconds at a time); B, only
while the UI is busy (at most a quarter second at a time). In each turn, over four of a big
job's background diagnoses: keys pressed while one runs, and keys pressed between them (a
sort key every fifth, as ``bench/tui_scale.py``), 50 ms apart, as a person presses them, not
back to back: a key's time is from its posting until every message queued before it is
handled and the screen repainted (``tui_scale._painted``). Prints each turn and, per side,
the median and 90th percentile over all turns' keys.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT), str(_ROOT / "bench")]

import tui_scale
from busy_node import node
from textual import events
from textual.app import App

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.model.job import JobModel
from ddptop.source import GIVE_WAY_MAX_S
from ddptop.tui import background_findings
from ddptop.tui.app import DdptopApp
from ddptop.tui.background_findings import BackgroundFindings
from ddptop.tui.table_actions import TableActions

HOLD, WITH_VIEWS, SLICE = TableActions.on_event, JobModel.with_views, BackgroundFindings.copy_slice_ranks
LINGER = (background_findings.KEY_LINGER_S, background_findings.DIAGNOSIS_MAX_WAIT_S)
CYCLES, PACE_S, WAIT_S = 4, 0.05, 30.0


def _without_index(self: JobModel, ranks: dict[int, object]) -> JobModel:
    copied = WITH_VIEWS(self, ranks)  # type: ignore[arg-type]
    if copied._status_index is not None:  # the diagnosis builds its own, as before
        copied.dirty_sinks.clear()
        copied._status_index = None
    return copied


def _way(what: str, today: bool) -> None:
    """Today's code (*today*) or the way before, for *what*."""
    TableActions.on_event = HOLD if today or what != "hold" else App.on_event  # type: ignore[method-assign]
    JobModel.with_views = WITH_VIEWS if today or what != "copy" else _without_index  # type: ignore[method-assign]
    BackgroundFindings.copy_slice_ranks = SLICE if today or what != "copy" else 1 << 30
    background_findings.KEY_LINGER_S, background_findings.DIAGNOSIS_MAX_WAIT_S = \
        LINGER if today or what != "linger" else (0.0, GIVE_WAY_MAX_S)


async def _press(app: DdptopApp, pilot, i: int) -> float:  # type: ignore[no-untyped-def]
    key = events.Key("greater_than_sign", ">") if i % 5 == 4 else events.Key("down", None)
    key.set_sender(app)
    began = time.perf_counter()
    app.post_message(key)
    await tui_scale._painted(pilot)
    return time.perf_counter() - began


async def _turn(job_id: str, n: int) -> dict[str, list[float]]:
    """Keys during and between background diagnoses, in one attach of the real app."""
    app = DdptopApp(LiveSource(resolve(job_id), digest=True))
    out: dict[str, list[float]] = {"during": [], "between": []}
    i = 0
    async with app.run_test(size=(200, 60)) as pilot:
        await tui_scale.every_rank_in(app, pilot, n)
        await pilot.pause(3.0)  # past the attach's first diagnoses
        for _ in range(CYCLES):
            deadline = time.monotonic() + WAIT_S
            while app._diagnosing and time.monotonic() < deadline:
                await pilot.pause(0.02)
            for _ in range(5):
                if app._diagnosing:
                    break
                out["between"].append(await _press(app, pilot, i))
                i += 1
                await pilot.pause(PACE_S)
            while not app._diagnosing and time.monotonic() < deadline:
                await pilot.pause(0.01)
            while app._diagnosing and time.monotonic() < deadline:
                out["during"].append(await _press(app, pilot, i))
                i += 1
                await pilot.pause(PACE_S)
    return out


def _line(keys: list[float]) -> str:
    if not keys:
        return "n=0"
    keys = sorted(keys)
    return (f"n={len(keys)} median {1000 * statistics.median(keys):.0f} ms"
            f" p90 {1000 * keys[int(0.9 * len(keys))]:.0f} ms p95 {1000 * keys[int(0.95 * len(keys))]:.0f} ms"
            f" max {1000 * keys[-1]:.0f} ms")


def main() -> int:
    """Alternate the two ways on one generator; print the turns and each side's keys."""
    parser = tui_scale.ab_parser(__doc__.split("\n")[0])
    parser.add_argument("--what", choices=("hold", "copy", "linger"), default="hold")
    args = parser.parse_args()
    n, names = args.ranks, {"hold": ("hold", "action"), "copy": ("sliced", "whole"),
                               "linger": ("linger", "busy")}[args.what]
    gen = tui_scale.digest_job(n, f"kh{n}")
    sides: dict[str, dict[str, list[float]]] = {w: {"during": [], "between": []} for w in names}
    try:
        for turn in range(args.turns):
            way = names[turn % 2]
            _way(args.what, today=turn % 2 == 0)
            with node("idle" if args.idle else "busy", gen.pid):
                got = asyncio.run(_turn(f"kh{n}", n))
            for k, v in got.items():
                sides[way][k].extend(v)
            print(f"{way:>6} during: {_line(got['during'])} | between: {_line(got['between'])}", flush=True)
    finally:
        gen.stop()
        _way(args.what, today=True)
    for way, keys in sides.items():
        print(f"all {way:>6} during: {_line(keys['during'])} | between: {_line(keys['between'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
