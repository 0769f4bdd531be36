"""A/B of the dashboard's folding and redrawing at scale, one run.

Run: ``.venv/bin/python bench/fold_slices_ab.py [--what slices|period|absorb|upkeep|pause]
[--ranks 32768] [--turns 6] [--idle]``.

One synthetic job through the node agents' digest lane; the real app headless, measured by
``bench/tui_scale.py``'s own ``_tui`` (redraw cycle, key p95, sort and move keys, UI CPU),
turns alternating A (today's) and B, on a busy node unless ``--idle``
(``bench/busy_node.py``). Prints each turn and the medians of each side. B is:

* ``slices``: one fold per wake-up instead of slices of ``FOLD_SLICE_S``;
* ``period``: a redraw every ``redraw_interval`` at any size (no ``SLOW_REDRAW_S``);
* ``absorb``: the row index's absorb at the end of each slice, in the same message (as before
  ``AbsorbReady``);
* ``upkeep``: folding, absorbing, the timer's redraw and the diagnosis's copy slices run while a
  key is on its way (as before ``tui/key_first``);
* ``pause``: automatic collections run while a background diagnosis holds its copy (as before
  ``ViewerCollector.pause``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT), str(_ROOT / "bench")]

import tui_scale
from busy_node import node

import ddptop.tui.app as app_module
from ddptop.client.collector import ViewerCollector
from ddptop.tui.app import DdptopApp, EventsReady
from ddptop.tui.key_first import KeyFirst

SHOWN = ("cycle_ms", "key_p95_ms", "sort_key_median_ms", "move_key_median_ms", "ui_ms_per_s")


def absorb_in_slice(self: DdptopApp, _message: EventsReady) -> None:
    """``on_events_ready`` as it was before ``AbsorbReady``: the absorb ends the slice."""
    events = self._buffer.drain()
    with self.source.foreground.busy():
        began = time.perf_counter()
        for i, event in enumerate(events):
            self.model.apply(event)
            if i & 15 == 15 and time.perf_counter() - began > app_module.FOLD_SLICE_S and i + 1 < len(events):
                self._buffer.put_back(events[i + 1:])
                self.post_message(EventsReady())
                break
        if self._index is not None and self._index.model is self.model:
            self._index.absorb()
    self._dirty = self._dirty or bool(events)


def set_way(what: str, today: bool) -> None:
    """The app as A (*today*) or B of *what*."""
    app_module.FOLD_SLICE_S = SLICE_S if today or what != "slices" else float("inf")
    app_module.SLOW_REDRAW_FROM_RANKS = SLOW_FROM if today or what != "period" else 1 << 62
    DdptopApp.on_events_ready = (  # type: ignore[method-assign]
        ON_EVENTS if today or what != "absorb" else absorb_in_slice)
    KeyFirst.waits = WAITS if today or what != "upkeep" else _never  # type: ignore[method-assign]
    ViewerCollector.pause = PAUSE if today or what != "pause" else _no_pause  # type: ignore[method-assign]


def _never(self: KeyFirst, kind: str) -> bool:
    return False


def _no_pause(self: ViewerCollector) -> Callable[[], None]:
    return lambda: None


SLICE_S, SLOW_FROM = app_module.FOLD_SLICE_S, app_module.SLOW_REDRAW_FROM_RANKS
ON_EVENTS = DdptopApp.on_events_ready
WAITS, PAUSE = KeyFirst.waits, ViewerCollector.pause


def main() -> int:
    """Alternate the two ways on one generator; print the turns and the medians."""
    parser = tui_scale.ab_parser(__doc__.split("\n")[0])
    parser.add_argument("--what", choices=("slices", "period", "absorb", "upkeep", "pause"), default="slices")
    args = parser.parse_args()
    n = args.ranks
    gen = tui_scale.digest_job(n, f"ab{n}")
    names = {"slices": ("slices", "whole"), "period": ("period", "every"), "absorb": ("message", "inline"),
             "upkeep": ("waits", "runs"), "pause": ("paused", "free")}
    a, b = names[args.what]
    results: dict[str, list[dict[str, float]]] = {a: [], b: []}
    try:
        for turn in range(args.turns):
            way = a if turn % 2 == 0 else b
            set_way(args.what, way == a)
            with node("idle" if args.idle else "busy", gen.pid):
                got = asyncio.run(tui_scale._tui(f"ab{n}", n, 40, digest=True))
            results[way].append(got)
            print(f"{way:>6} " + " ".join(f"{k} {got[k]:.1f}" for k in SHOWN), flush=True)
    finally:
        gen.stop()
        set_way(args.what, True)
    for way, runs in results.items():
        if runs:
            print(f"median {way:>6} " + " ".join(f"{k} {statistics.median(r[k] for r in runs):.1f}"
                                                for k in SHOWN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
