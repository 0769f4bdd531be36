"""A/B: the dashboard folding waiting events in slices (``FOLD_SLICE_S``) or whole, one run.

Run: ``.venv/bin/python bench/fold_slices_ab.py [--ranks 32768] [--turns 6] [--idle]``.

One synthetic job through the node agents' digest lane; the real app headless, measured by
``bench/tui_scale.py``'s own ``_tui`` (redraw cycle, key p95, sort and move keys, UI CPU),
turns alternating A (slices of 8 ms) and B (one fold per wake-up), on a busy node unless
``--idle`` (``bench/busy_node.py``). Prints each turn and the medians of each side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_ROOT), str(_ROOT / "bench")]

import tui_scale
from busy_node import node

import ddptop.tui.app as app_module
from ddptop.testing.synthetic import ensure_fd_limit, run_in_subprocess

SHOWN = ("cycle_ms", "key_p95_ms", "sort_key_median_ms", "move_key_median_ms", "ui_ms_per_s")


def main() -> int:
    """Alternate the two ways on one generator; print the turns and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=32768)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--idle", action="store_true", help="an idle node instead of a busy one")
    args = parser.parse_args()
    n, sliced = args.ranks, app_module.FOLD_SLICE_S
    rt = Path(tempfile.mkdtemp(prefix="ddptop-ab-"))
    os.environ["DDPTOP_RUNTIME_DIR"], os.environ["DDPTOP_VIA"] = str(rt), "agent"
    ensure_fd_limit(n // 8 + 512)
    gen = run_in_subprocess(n, f"ab{n}", "healthy", 1.0, rt, ready_timeout=600,
                            extra_args=tui_scale.generator_args(n, ["digest"]) or ())
    results: dict[str, list[dict[str, float]]] = {"slices": [], "whole": []}
    try:
        for turn in range(args.turns):
            way = "slices" if turn % 2 == 0 else "whole"
            app_module.FOLD_SLICE_S = sliced if way == "slices" else float("inf")
            with node("idle" if args.idle else "busy", gen.pid):
                got = asyncio.run(tui_scale._tui(f"ab{n}", n, 40, digest=True))
            results[way].append(got)
            print(f"{way:>6} " + " ".join(f"{k} {got[k]:.1f}" for k in SHOWN), flush=True)
    finally:
        gen.stop()
        app_module.FOLD_SLICE_S = sliced
    for way, runs in results.items():
        if runs:
            print(f"median {way:>6} " + " ".join(f"{k} {statistics.median(r[k] for r in runs):.1f}"
                                                for k in SHOWN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
