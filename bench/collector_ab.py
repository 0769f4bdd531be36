"""The viewer's garbage-collector policy, A/B: each measurement in a fresh process, alternated.

Run: ``.venv/bin/python bench/collector_ab.py [--ranks 32768] [--pairs 3] [--against TREE]
[--lane digest|agent]``.

``--against TREE`` compares two versions of the viewer instead, both with the current policy:
this checkout's against the one in TREE (say ``git worktree add /tmp/old 8c13cc6``), each run a
fresh process importing ddptop from its own tree, against the one generator of this checkout.

``bench/tui_scale.py --via digest,digest+oldgc`` measures both policies in one process, one
after the other, and on this machine the second of a pair came out worse whichever it was (the
first's heap and the generator's growing history weigh on it). Here one synthetic job (agents
only, digest lane) runs for the whole bench, and every measurement is a new viewer process,
the two policies alternated (A B, B A, ...): the attach (its wall time and CPU, and the
release's one full collection) and the dashboard's redraw and key p95, as ``tui_scale``
measures them. Medians per policy are printed, with every run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))

from ddptop.testing.synthetic import run_in_subprocess

_CHILD = """
import asyncio, json, sys
sys.path[:0] = [{root!r}, {bench!r}]
import tui_scale as B
from ddptop.testing.synthetic import ensure_fd_limit
n, old = {n}, {old}
ensure_fd_limit(n // 8 + 512)
out = B.measure_ingest({job!r}, n, 2.0, {digest}, old)
out.update(asyncio.run(B._tui({job!r}, n, {presses}, {digest}, old)))
print(json.dumps(out))
"""
_SHOWN = [("attach_s", "attach s"), ("attach_cpu_s", "attach CPU s"), ("release_s", "freeze s"),
          ("events_per_s", "events/s"), ("cpu_ms_per_s", "ingest ms/s"),
          ("update_ms", "update ms"), ("cycle_ms", "redraw ms"), ("key_p95_ms", "key p95 ms"),
          ("ui_ms_per_s", "UI CPU ms/s")]


def measure(job_id: str, n: int, old: bool, presses: int, root: Path = _ROOT,
            digest: bool = True) -> dict[str, float]:
    """One viewer process (ddptop imported from *root*): attach, then the dashboard; its figures."""
    code = _CHILD.format(root=str(root), bench=str(root / "bench"), n=n, old=old, job=job_id,
                         presses=presses, digest=digest)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          check=False, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"viewer failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _cell(run: dict[str, float], key: str) -> str:
    value = run.get(key, float("nan"))
    return f"{value:.2f}" if key.endswith("_s") else f"{value:.0f}"


def main() -> int:
    """Alternate the policies in fresh processes and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=32768)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--against", type=Path, default=None,
                        help="another checkout's viewer as B (both with the current policy)")
    parser.add_argument("--lane", choices=("digest", "agent"), default="digest",
                        help="the agents' digest lane, or their stream of whole states")
    args = parser.parse_args()
    if args.against is not None and not (args.against / "ddptop" / "tui" / "app.py").is_file():
        parser.error(f"{args.against} is not a ddptop checkout")
    ways = ("this", "that") if args.against is not None else ("held", "old")
    rt = Path(tempfile.mkdtemp(prefix="ddptop-gc-ab-"))
    os.environ["DDPTOP_RUNTIME_DIR"], os.environ["DDPTOP_VIA"] = str(rt), "agent"
    job_id = f"gcab{args.ranks}"
    gen = run_in_subprocess(args.ranks, job_id, "healthy", 1.0, rt, extra_args=("--agents-only",),
                            ready_timeout=600)
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    try:
        for i in range(args.pairs):
            for policy in ways if i % 2 == 0 else ways[::-1]:
                began = time.monotonic()
                root = args.against if policy == "that" else _ROOT
                runs[policy].append(measure(job_id, args.ranks, policy == "old", args.presses, root,
                                            args.lane == "digest"))
                took = time.monotonic() - began
                print(f"  {policy} run {len(runs[policy])}: {took:.0f} s", file=sys.stderr)
    finally:
        gen.stop()
    print(f"{args.ranks} ranks, {args.lane} lane, {args.pairs} runs per policy, fresh process each, "
          "alternated")
    print(f"{'policy':>6} " + " ".join(f"{label:>12}" for _, label in _SHOWN) + "   (median; each run)")
    for policy, got in runs.items():
        cells = [statistics.median(r.get(key, float("nan")) for r in got) for key, _ in _SHOWN]
        each = "; ".join("/".join(_cell(r, key) for key, _ in _SHOWN) for r in got)
        print(f"{policy:>6} " + " ".join(f"{c:>12.2f}" for c in cells) + f"   ({each})")
    if args.against is not None:
        print(f"this: the viewer of {_ROOT}; that: the viewer of {args.against.resolve()}")
    else:
        print("held: the collector held off during the attach, then the attach frozen"
              " (ddptop.client.collector); old: young collections every 50,000 allocations only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
