"""A viewer's memory while it watches a big job: what its model keeps grows, then stops.

Run: ``.venv/bin/python bench/viewer_memory.py [--ranks 32768] [--seconds 180] [--every 30]
[--against TREE]``.

One synthetic job (agents only, digest lane, 1 s samples) runs for the whole bench; a viewer
process (a LiveSource folding into a JobModel, the collector as the dashboard keeps it: the
dashboard's own model, without the screen) attaches, and every ``--every`` seconds we print its
resident memory (``/proc/self/statm``) above what it held once every rank was in, and how many
history samples its model holds. ``--against TREE`` runs a second viewer, imported from TREE
(say ``git worktree add /tmp/old HEAD~1``), after the first, against the same job. Memory is
not a timing: the two need not be interleaved, and a busy machine changes little of it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))

from ddptop.testing.synthetic import run_in_subprocess

_CHILD = """
import json, os, sys, threading, time
sys.path[:0] = [{root!r}, {bench!r}]
from tui_scale import wait_for
from ddptop.client.collector import ViewerCollector
from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.model.job import JobModel
from ddptop.testing.synthetic import ensure_fd_limit

n, seconds, every = {n}, {seconds}, {every}
ensure_fd_limit(n // 8 + 512)
page = os.sysconf("SC_PAGE_SIZE")

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page / 2**20

model, lock = JobModel(), threading.Lock()
def fold(event):
    with lock:
        model.apply(event)
source, collector = LiveSource(resolve({job!r}), digest=True), ViewerCollector()
collector.start()
source.start(fold, pulses=fold)
def every_rank_in():
    with lock:
        return sum(1 for v in model.ranks.values() if v.base is not None) >= n
wait_for(every_rank_in, 120 + n / 256, f"a state from each of {{n}} ranks")
with lock:
    collector.attached(n, settled=True)
base, began, rows = rss_mib(), time.monotonic(), []
while time.monotonic() - began < seconds:
    time.sleep(every)
    with lock:
        samples = sum(len(v.history) for v in model.ranks.values())
    rows.append((round(time.monotonic() - began), round(rss_mib() - base), samples))
source.stop()
collector.stop()
print(json.dumps({{"base_mib": round(base), "rows": rows}}))
"""


def measure(job_id: str, n: int, seconds: float, every: float, root: Path) -> dict[str, object]:
    """One viewer process importing ddptop from *root*: its memory over *seconds*."""
    code = _CHILD.format(root=str(root), bench=str(root / "bench"), n=n, job=job_id, seconds=seconds,
                         every=every)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=seconds + 900, check=False, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"viewer failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    """Run the viewer(s) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=32768)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--against", type=Path, default=None, help="a second ddptop checkout to compare")
    args = parser.parse_args()
    if args.against is not None and not (args.against / "ddptop" / "model" / "job.py").is_file():
        parser.error(f"{args.against} is not a ddptop checkout")
    rt = Path(tempfile.mkdtemp(prefix="ddptop-mem-"))
    os.environ["DDPTOP_RUNTIME_DIR"], os.environ["DDPTOP_VIA"] = str(rt), "agent"
    job_id = f"mem{args.ranks}"
    gen = run_in_subprocess(args.ranks, job_id, "healthy", 1.0, rt,
                            extra_args=("--agents-only", "--ranks-per-agent", "8"), ready_timeout=600)
    trees = {"this": _ROOT, **({"that": args.against} if args.against is not None else {})}
    runs: dict[str, dict[str, object]] = {}
    try:
        for name, root in trees.items():
            runs[name] = measure(job_id, args.ranks, args.seconds, args.every, root)
            print(f"  {name} done", file=sys.stderr)
    finally:
        gen.stop()
    print(f"{args.ranks} ranks, digest lane, 1 s samples: resident memory above the attach, "
          "and history samples held")
    print(f"{'viewer':>6} {'attach MiB':>10} " + " ".join(f"{'t+' + str(t) + ' s':>18}"
                                                        for t, _, _ in runs["this"]["rows"]))  # type: ignore[misc]
    for name, run in runs.items():
        cells = " ".join(f"{f'+{mib} MiB/{samples / 1e6:.2f}M':>18}" for _, mib, samples in run["rows"])  # type: ignore[attr-defined]
        print(f"{name:>6} {run['base_mib']:>10} {cells}")
    for name, root in trees.items():
        print(f"{name}: the viewer of {root.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
