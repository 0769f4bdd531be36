"""What fleet metrics cost: the node agent's CPU with and without scrapes, and a scrape's time.

    python bench/metrics_bench.py [--seconds 30] [--ranks 8 64] [--rounds 2] [--scrape-every 1]

For each rank count a synthetic job (``ddptop.testing.synthetic``: real reporter servers, real
protocol, one process) runs at 1 Hz under the node agent (``python -m ddptop.agent
--metrics-port 127.0.0.1:0``, the same ``NodeAgent`` that ``ddptop launch`` runs). Runs
alternate A/B in one invocation (the machine is shared and noisy): A is never scraped, B
is scraped every ``--scrape-every`` seconds (1 s is four times more often than a typical
Prometheus config). Printed: the agent's CPU share of one core in each (from the reaped
child's rusage), their ratio, and per scrape its wall time (median, max) and size.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.testing.synthetic_process import run_in_subprocess

URL = re.compile(r"metrics at (http://\S+/metrics)")


def one_run(ranks: int, seconds: float, scrape_every: float | None) -> dict[str, float]:
    """One synthetic job under a metrics-serving agent; scraped or not."""
    runtime = Path(tempfile.mkdtemp(prefix="ddptop-mb-"))
    os.environ["DDPTOP_RUNTIME_DIR"] = str(runtime)
    job_id = f"mb{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    times: list[float] = []
    sizes: list[int] = []
    with run_in_subprocess(ranks, job_id, interval_s=1.0):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        agent = subprocess.Popen([sys.executable, "-m", "ddptop.agent", "--job-id", job_id,
                                  "--seconds", str(seconds), "--metrics-port", "127.0.0.1:0"],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert agent.stderr is not None
        found = URL.search(agent.stderr.readline())
        if found is None:
            agent.kill()
            raise SystemExit("the agent did not say where its metrics are")
        next_scrape = time.monotonic() + 2.0  # past the agent's first subscriptions
        while agent.poll() is None and time.monotonic() - began < seconds + 30:
            if scrape_every is not None and time.monotonic() >= next_scrape:
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(found.group(1), timeout=5) as resp:
                        sizes.append(len(resp.read()))
                    times.append(time.perf_counter() - t0)
                except OSError:
                    pass  # the agent ends on its own clock: a last scrape may find it gone
                next_scrape += scrape_every
            time.sleep(0.05)
        agent.wait(timeout=30)
        wall = time.monotonic() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_share": cpu / wall, "scrapes": len(times),
            "median_ms": statistics.median(times) * 1000 if times else 0.0,
            "max_ms": max(times) * 1000 if times else 0.0,
            "bytes": statistics.median(sizes) if sizes else 0.0}


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{'ranks':>5} {'round':>5} {'CPU unscraped':>14} {'CPU scraped':>12} {'ratio':>6} "
          f"{'scrapes':>7} {'scrape median':>13} {'scrape max':>10} {'bytes':>8}")
    for ranks in args.ranks:
        for rnd in range(args.rounds):
            a = one_run(ranks, args.seconds, None)
            b = one_run(ranks, args.seconds, args.scrape_every)
            ratio = b["cpu_share"] / a["cpu_share"] if a["cpu_share"] else float("nan")
            print(f"{ranks:>5} {rnd + 1:>5} {a['cpu_share']:>14.2%} {b['cpu_share']:>12.2%} {ratio:>6.2f} "
                  f"{b['scrapes']:>7.0f} {b['median_ms']:>11.1f}ms {b['max_ms']:>8.1f}ms {b['bytes']:>8.0f}")


if __name__ == "__main__":
    main()
