"""Viewer ingest through node agents vs straight to every rank: 4096 (to 32,768) ranks behind agents of 8.

Run: ``.venv/bin/python bench/agent_fanin.py [--ranks 4096] [--per-agent 8] [--window 5] [--rounds 3]``;
the sizes of issue 23 are ``--ranks 4096,8192,16384,32768``. Where a socket per rank does not
fit the open-files hard limit (``fds_needed``), the generator serves through its agents only
(``--agents-only``) and the ``ranks`` rows say n/a.

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
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.digest import PulseBatch
from ddptop.model.job import JobModel
from ddptop.protocol import Event
from ddptop.testing.synthetic import ensure_fd_limit, fds_needed, run_in_subprocess


def ingest(job_id: str, n: int, via: str, window: float) -> dict[str, float]:
    """Attach *via* "ranks", "agent" (the agents' stream) or "digest" (their digest lane), wait
    for every rank's state, then measure *window* s."""
    os.environ["DDPTOP_VIA"] = "ranks" if via == "ranks" else "agent"
    model, lock = JobModel(), threading.Lock()
    count = [0]

    def emit(event: Event) -> None:
        with lock:
            model.apply(event)
        count[0] += 1

    def pulses(batch: PulseBatch) -> None:  # the digest lane: one batch per node digest
        with lock:
            model.apply(batch)
        count[0] += len(batch.pulses)

    target = resolve(job_id)
    source = LiveSource(target, digest=via == "digest")
    began = time.monotonic()
    source.start(emit, pulses=pulses)
    try:
        deadline = time.monotonic() + 120 + n / 256
        while True:
            with lock:
                have = sum(1 for v in model.ranks.values() if v.base is not None)
            if have >= n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{via}: states from {have} of {n} ranks after {120 + n / 256:.0f} s")
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


def fits(needed: int) -> bool:
    """Whether *needed* open files fit under the hard limit (the generator's is the same as ours)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return hard == resource.RLIM_INFINITY or needed <= hard


def one_size(n: int, k: int, rounds: int, window: float,
             ways: tuple[str, ...] = ("ranks", "agent")) -> list[tuple[int, str, dict[str, float]]]:
    """Alternate the ways that can run at *n* ranks for *rounds* rounds; {} for one that cannot."""
    both = fits(fds_needed(n, k)) and fits(n + 512)  # the generator's sockets, and ours per rank
    rt = Path(tempfile.mkdtemp(prefix="ddptop-fanin-"))
    os.environ["DDPTOP_RUNTIME_DIR"] = str(rt)
    job_id = f"fanin{n}"
    extra = ("--ranks-per-agent", str(k)) if both else ("--agents-only", "--ranks-per-agent", str(k))
    gen = run_in_subprocess(n, job_id, "healthy", 1.0, rt, extra_args=extra, ready_timeout=600)
    rows: list[tuple[int, str, dict[str, float]]] = []
    try:
        for i in range(rounds):
            for via in (ways if i % 2 == 0 else ways[::-1]):  # A/B, then B/A
                if via == "ranks" and not both:
                    rows.append((i + 1, via, {}))  # a socket per rank does not fit: n/a
                    continue
                ensure_fd_limit((n if via == "ranks" else n // k) + 512)
                rows.append((i + 1, via, ingest(job_id, n, via, window)))
                print(f"  {n} ranks round {i + 1} {via} done", file=sys.stderr, flush=True)
    finally:
        gen.stop()
    return rows


def main() -> int:
    """Alternate the two ways for --rounds rounds at each size and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="4096", help="sizes, comma-separated")
    parser.add_argument("--per-agent", type=int, default=8)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--via", default="ranks,agent",
                        help="ways to compare, alternated: ranks, agent (the agents' stream of states), "
                             "digest (their digest lane)")
    args = parser.parse_args()
    k = args.per_agent
    ways = tuple(args.via.split(","))
    sizes = [int(x) for x in args.ranks.split(",")]
    results = [(n, one_size(n, k, args.rounds, args.window, ways)) for n in sizes]
    for n, rows in results:
        print(f"{n} ranks, {(n + k - 1) // k} node agents of {k} ranks, {args.window:g} s windows")
        head = (f"{'round':>5} {'via':>6} {'connections':>11} {'attach s':>8} {'ingest CPU ms/s':>15} "
                f"{'events/s':>8}")
        print(head)
        print("-" * len(head))
        for rnd, via, r in rows:
            if not r:
                print(f"{rnd:>5} {via:>6} {'n/a':>11} {'n/a':>8} {'n/a':>15} {'n/a':>8}")
                continue
            print(f"{rnd:>5} {via:>6} {r['connections']:>11.0f} {r['attach_s']:>8.2f} "
                  f"{r['cpu_ms_per_s']:>15.1f} {r['events_per_s']:>8.0f}")
        for a_way, b_way in (("agent", "ranks"), ("digest", "agent"), ("digest", "ranks")):
            if a_way not in ways or b_way not in ways:
                continue
            pairs = [(a, b) for a, b in zip([r for _, v, r in rows if v == a_way],
                                            [r for _, v, r in rows if v == b_way], strict=True) if a and b]
            if pairs:
                cpu_ratio = statistics.median(a["cpu_ms_per_s"] / b["cpu_ms_per_s"] for a, b in pairs)
                attach_ratio = statistics.median(a["attach_s"] / b["attach_s"] for a, b in pairs)
                print(f"median ratio {a_way}/{b_way}: ingest CPU {cpu_ratio:.2f}, attach {attach_ratio:.2f}")
            else:
                print(f"median ratio {a_way}/{b_way}: n/a (that way cannot run at this size here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
