"""Viewer ingest through node agents vs straight to every rank: 4096 ranks behind 512 agents.

Run: ``.venv/bin/python bench/agent_fanin.py [--ranks 4096] [--per-agent 8] [--window 5] [--rounds 3]``.

One synthetic job (``ddptop.testing.synthetic --ranks-per-agent K``, 1 s sample interval,
real sockets, in a SUBPROCESS so its CPU is not counted here) serves every rank both ways:
each fake rank's own server, and one node-agent endpoint per K ranks speaking the agent's
protocol (``AgentReply`` catch-up, ``RecordEntry`` stream). The viewer is the real
``LiveSource`` folding into a ``JobModel`` (as the dashboard does), with ``DDPTOP_VIA``
set to ``ranks`` or ``agent``; the two are measured in alternation (A/B interleaved, one
run: this machine is shared and noisy) and the table gives each round plus the median ratio.

Columns: connections the viewer opened; attach = seconds from start to a state of every
rank; ingest CPU = this process's CPU ms per wall second over ``--window`` seconds of the
steady stream (only the LiveSource thread works); events/s folded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.model.job import JobModel
from ddptop.protocol import Event
from ddptop.testing.synthetic import ensure_fd_limit, run_in_subprocess


def ingest(job_id: str, n: int, via: str, window: float) -> dict[str, float]:
    """Attach with DDPTOP_VIA=*via*, wait for every rank's state, then measure *window* s."""
    os.environ["DDPTOP_VIA"] = via
    model, lock = JobModel(), threading.Lock()
    count = [0]

    def emit(event: Event) -> None:
        with lock:
            model.apply(event)
        count[0] += 1

    target = resolve(job_id)
    source = LiveSource(target)
    began = time.monotonic()
    source.start(emit)
    try:
        deadline = time.monotonic() + 120
        while True:
            with lock:
                have = sum(1 for v in model.ranks.values() if v.state is not None)
            if have >= n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{via}: states from {have} of {n} ranks after 120 s")
            time.sleep(0.05)
        attach_s = time.monotonic() - began
        time.sleep(1.5)  # history replies and connect bursts pass: measure the steady stream
        ev0, cpu0, wall0 = count[0], time.process_time(), time.monotonic()
        time.sleep(window)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        return {"connections": source.connections, "attach_s": attach_s, "cpu_ms_per_s": 1000 * cpu / wall,
                "events_per_s": (count[0] - ev0) / wall}
    finally:
        source.stop()


def main() -> int:
    """Alternate the two ways for --rounds rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--per-agent", type=int, default=8)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n, k = args.ranks, args.per_agent
    ensure_fd_limit(n + 512)
    rt = Path(tempfile.mkdtemp(prefix="ddptop-fanin-"))
    os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
    job_id = f"fanin{n}"
    gen = run_in_subprocess(n, job_id, "healthy", 1.0, rt, extra_args=("--ranks-per-agent", str(k)),
                            ready_timeout=180)
    rows: list[tuple[int, str, dict[str, float]]] = []
    try:
        for i in range(args.rounds):
            for via in (("ranks", "agent") if i % 2 == 0 else ("agent", "ranks")):
                rows.append((i + 1, via, ingest(job_id, n, via, args.window)))
                print(f"  round {i + 1} {via} done", file=sys.stderr, flush=True)
    finally:
        gen.stop()
    print(f"{n} ranks, {(n + k - 1) // k} node agents of {k} ranks, {args.window:g} s windows")
    head = (f"{'round':>5} {'via':>6} {'connections':>11} {'attach s':>8} {'ingest CPU ms/s':>15} "
            f"{'events/s':>8}")
    print(head)
    print("-" * len(head))
    for rnd, via, r in rows:
        print(f"{rnd:>5} {via:>6} {r['connections']:>11.0f} {r['attach_s']:>8.2f} {r['cpu_ms_per_s']:>15.1f} "
              f"{r['events_per_s']:>8.0f}")
    pairs = list(zip([r for _, v, r in rows if v == "agent"], [r for _, v, r in rows if v == "ranks"],
                     strict=True))
    cpu_ratio = statistics.median(a["cpu_ms_per_s"] / b["cpu_ms_per_s"] for a, b in pairs)
    attach_ratio = statistics.median(a["attach_s"] / b["attach_s"] for a, b in pairs)
    print(f"median ratio agent/ranks: ingest CPU {cpu_ratio:.2f}, attach {attach_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
