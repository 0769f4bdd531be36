"""The node agent's CPU for 8 local ranks at 1 Hz: recording alone, and serving a viewer too.

    python bench/agent_cpu.py [--ranks 8] [--seconds 30] [--rounds 3]

A synthetic job (``ddptop.testing.synthetic``: real reporter servers, real protocol, one
process) runs at 1 Hz; the node agent (``python -m ddptop.agent``, the ``NodeAgent`` that
``ddptop launch`` runs) subscribes to every rank and keeps the black box. Two ways,
alternated round by round (A/B interleaved, one run: the machine is shared):

* ``record``: the agent alone (what every job pays);
* ``record+serve``: the agent also serves its node endpoint (``--serve 127.0.0.1``) and a
  viewer (``LiveSource`` with ``DDPTOP_VIA=agent``) stays subscribed through it all along.

The agent's CPU share is user + system time of its process (reaped children's rusage) over
wall time; the goal is at most 2 % of one core. None of it is on a rank's thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import resolve
from ddptop.testing.synthetic_process import run_in_subprocess

GOAL = 0.02


def serving_port(agent: subprocess.Popen[str], timeout: float) -> int:
    """The port the agent printed on stderr ("serving viewers on ADDR:PORT")."""
    assert agent.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([agent.stderr], [], [], 0.5)
        if ready:
            line = agent.stderr.readline()
            if "serving viewers on" in line:
                return int(line.rsplit(":", 1)[1])
            if not line:
                break
    raise RuntimeError("the agent never said where it serves")


def run_once(ranks: int, seconds: float, serve: bool) -> float:
    """One synthetic job under the agent; the agent's CPU share."""
    runtime = Path(tempfile.mkdtemp(prefix="ddptop-acpu-"))
    os.environ["DDPTOP_RUNTIME_DIR"] = str(runtime)
    job_id = f"ac{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with run_in_subprocess(ranks, job_id, interval_s=1.0):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.monotonic()
        cmd = [sys.executable, "-m", "ddptop.agent", "--job-id", job_id, "--seconds", str(seconds)]
        agent = subprocess.Popen([*cmd, *(["--serve", "127.0.0.1"] if serve else [])], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        viewer = None
        try:
            if serve:
                port = serving_port(agent, 30)
                target = resolve(job_id)
                target = dataclasses.replace(target, via_agents=True, endpoints=[
                    dataclasses.replace(e, agent_port=port) for e in target.endpoints])
                viewer = LiveSource(target)
                feed = ModelFeed(job_id, ranks)
                viewer.start(feed.emit)
            agent.wait(timeout=seconds + 30)
            wall = time.monotonic() - began
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # only the agent was reaped
        finally:
            if viewer is not None:
                viewer.stop()
            if agent.poll() is None:
                agent.kill()
                agent.wait(timeout=10)
        if serve and feed.settled(range(ranks), states=int(seconds / 2)) < ranks:
            raise RuntimeError("the viewer behind the agent did not keep up with every rank")
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / wall


def main() -> None:
    """Print one row per round and way, and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shares: dict[str, list[float]] = {"record": [], "record+serve": []}
    print(f"{'round':>5} {'agent':>13} {'ranks':>5} {'agent CPU':>10}")
    for i in range(args.rounds):
        order = ("record", "record+serve") if i % 2 == 0 else ("record+serve", "record")
        for way in order:
            share = run_once(args.ranks, args.seconds, serve=way == "record+serve")
            shares[way].append(share)
            print(f"{i + 1:>5} {way:>13} {args.ranks:>5} {share:>9.2%}", flush=True)
    for way, values in shares.items():
        median = statistics.median(values)
        print(f"median {way}: {median:.2%} of a core ({'within' if median <= GOAL else 'OVER'} the "
              f"{GOAL:.0%} goal)")


if __name__ == "__main__":
    main()
