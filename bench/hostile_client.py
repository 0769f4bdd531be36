"""A real job attacked by hostile local clients vs. left alone, A/B interleaved in one run.

    .venv/bin/python bench/hostile_client.py [--rounds 3] [--phase 10] [--nproc 2]

One job (``ddptop launch -- torchrun --nproc-per-node 2 probes/healthy.py``, gloo, CPU)
runs throughout. Phases alternate: A (nobody attacks) and B (every rank attacked at once
by silent sockets, garbage senders, huge length prefixes, and request floods that never
read a reply). Per phase the bench takes the ranks' step rate (from their own step
counters), their RSS, and how long a real viewer (``ddptop snapshot --json JOB``, the CLI
a person types) takes to answer. Prints the table: step time ratio B/A, rank RSS growth
over the run, the viewer's answer times, and what the ranks' servers counted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.protocol import Request
from ddptop.store import discovery
from ddptop.wire import LENGTH, encode_frame, header_bytes
from tests.jobs import JobRunner, RunningJob, ddptop_cmd

FLOOD = b"".join(encode_frame(Request(command="state", id=i + 1)) for i in range(500))


class Attack:
    """Hostile local clients against every endpoint, until stopped."""

    def __init__(self, ports: list[int]) -> None:
        self._stop = threading.Event()
        self.threads = [threading.Thread(target=fn, args=(port,), daemon=True)
                        for port in ports
                        for fn in (self._silent, self._garbage, self._huge_length, self._flood, self._flood)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        """End every attacker (each loop checks the flag at least every 0.2 s)."""
        self._stop.set()
        for t in self.threads:
            t.join(timeout=5)

    def _connect(self, port: int) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=0.2)
            sock.settimeout(0.2)
            return sock
        except OSError:
            return None

    def _silent(self, port: int) -> None:
        """Keep 16 sockets open that never send a byte (re-opened when closed)."""
        held: list[socket.socket] = []
        while not self._stop.wait(0.1):
            held = [s for s in held if s.fileno() >= 0]
            while len(held) < 16 and (s := self._connect(port)) is not None:
                held.append(s)
        for s in held:
            s.close()

    def _garbage(self, port: int) -> None:
        while not self._stop.wait(0.02):
            if (s := self._connect(port)) is not None:
                try:
                    s.sendall(os.urandom(4096))
                except OSError:
                    pass
                s.close()

    def _huge_length(self, port: int) -> None:
        while not self._stop.wait(0.02):
            if (s := self._connect(port)) is not None:
                try:
                    s.sendall(header_bytes() + LENGTH.pack(2**32 - 1) + b"x" * 1024)
                except OSError:
                    pass
                s.close()

    def _flood(self, port: int) -> None:
        """Send read-only requests as fast as the rank takes them; never read a reply."""
        while not self._stop.is_set():
            s = self._connect(port)
            if s is None:
                self._stop.wait(0.1)
                continue
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            try:
                s.sendall(header_bytes())
                while not self._stop.is_set():
                    try:
                        s.sendall(FLOOD)
                    except TimeoutError:
                        continue  # the rank stopped reading us: TCP pushes back
            except OSError:
                pass  # closed by the rank; reconnect
            finally:
                s.close()


def _snapshot(job: RunningJob) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    res = subprocess.run(ddptop_cmd("snapshot", "--json", job.job_id), env=job.env, capture_output=True,
                         text=True, timeout=60, check=False)
    took = time.monotonic() - t0
    snap = json.loads(res.stdout) if res.stdout.strip() else {"ranks": []}
    return snap, took


def _ranks(snap: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in snap["ranks"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phase", type=float, default=10.0, help="seconds per phase")
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ddptop-hostile-"))
    runner = JobRunner(tmp)
    os.environ["DDPTOP_RUNTIME_DIR"] = str(runner.runtime_dir)
    seconds = 30 + 2 * args.rounds * (args.phase + 8)
    job = runner.start("healthy", nproc=args.nproc, env={"PROBE_SECONDS": str(int(seconds))}, interval=1.0)
    try:
        job.wait_ranks(args.nproc, timeout=120)
        ports = [e.port for e in discovery.read_entries() if e.job_id == job.job_id]
        first, _ = _snapshot(job)
        rss0 = {k: r["rss_bytes"] for k, r in _ranks(first).items()}
        rates: dict[str, list[float]] = {"A": [], "B": []}
        grew: dict[str, float] = {"A": 0.0, "B": 0.0}  # rank RSS growth summed over phases, MiB
        answers: dict[str, list[float]] = {"A": [], "B": []}
        unanswered = {"A": 0, "B": 0}
        last = first
        for _ in range(args.rounds):
            for phase in ("A", "B"):
                start, took = _snapshot(job)
                attack = Attack(ports) if phase == "B" else None
                deadline = time.monotonic() + args.phase
                while time.monotonic() < deadline:  # the viewer asks every ~2 s during the phase
                    snap, took = _snapshot(job)
                    answers[phase].append(took)
                    unanswered[phase] += args.nproc - len(snap["ranks"])
                    time.sleep(max(0.0, min(2.0, deadline - time.monotonic())))
                end, took = _snapshot(job)
                if attack is not None:
                    attack.stop()
                a, b = _ranks(start), _ranks(end)
                common = set(a) & set(b)
                if common:
                    grew[phase] += max(b[k]["rss_bytes"] - a[k]["rss_bytes"] for k in common) / 2**20
                for rank in set(a) & set(b):
                    dt = b[rank]["time"] - a[rank]["time"]
                    if dt > 0 and b[rank]["step"] > a[rank]["step"]:
                        rates[phase].append(dt / (b[rank]["step"] - a[rank]["step"]))
                last = end if end["ranks"] else last
        final = _ranks(last)
    finally:
        job.stop()
    step_a, step_b = statistics.median(rates["A"]), statistics.median(rates["B"])
    growth = max(final[k]["rss_bytes"] - rss0[k] for k in final if k in rss0) / 2**20
    print(f"hostile_client: {args.nproc} ranks (gloo, probes/healthy.py under ddptop launch), "
          f"{args.rounds} rounds of A (alone) / B (attacked) x {args.phase:g} s")
    print(f"{'phase':6} {'step time ms':>13} {'snapshot s (median/max)':>24} {'ranks unanswered':>17}")
    for phase, step in (("A", step_a), ("B", step_b)):
        ans = answers[phase]
        print(f"{phase:6} {step * 1000:>13.2f} {statistics.median(ans):>12.2f} / {max(ans):<9.2f} "
              f"{unanswered[phase]:>17}")
    print(f"step time ratio B/A: {step_b / step_a:.3f}")
    print(f"rank RSS growth over the run (max over ranks): {growth:.1f} MiB; summed over "
          f"A phases {grew['A']:.1f} MiB, over B phases {grew['B']:.1f} MiB")
    for rank, r in sorted(final.items()):
        rep = r["reporter"]
        print(f"rank {rank} reporter: rate_limited={rep.get('rate_limited')} "
              f"dropped_replies={rep.get('dropped_replies')} rejected={rep.get('rejected_peers')} "
              f"timed_out={rep.get('timed_out_peers')} evicted={rep.get('evicted_peers')} "
              f"errors={rep['errors']} clients={rep['clients']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
