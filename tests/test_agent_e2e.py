"""Viewers that reach a real job through its node agent: one connection per node.

A 4-rank job under ``ddptop launch``, watched with ``DDPTOP_VIA=agent``: every verb sees
all ranks while each rank serves exactly one peer (its agent), a SIGSTOPped rank is named
``rank_unresponsive`` from what the agent read outside it, and the stacks key's path
(``LiveSource.request_stacks``) gets every rank's stack through one request to the node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import resolve
from ddptop.proctree import stop_tree
from ddptop.testing.synthetic_process import run_in_subprocess
from tests.jobs import ROOT, JobRunner
from tests.test_stacks_outside import INTERVAL, LIMIT_S, live_view_stuck, wait_unresponsive

pytestmark = pytest.mark.slow

VIA_AGENT = {"DDPTOP_VIA": "agent", "DDPTOP_PYSPY": "0", "PROBE_SECONDS": "90"}


def served_by_the_agent_only(snap: dict[str, Any]) -> bool:
    """Four running ranks, each with one peer: its node agent (this viewer went through it)."""
    ranks = snap["ranks"]
    return (len(ranks) == 4 and all(r["status"] == "running" for r in ranks)
            and all(r["reporter"]["clients"] == 1 for r in ranks))


def stacks_through(job_env: dict[str, str], job_id: str) -> str:
    """`request_stacks` of a LiveSource on *job_id*: which ranks answered, and the errors."""
    code = ("import sys, time\n"
            "from ddptop import auth\n"
            "from ddptop.client.live import LiveSource\n"
            "from ddptop.client.model_feed import ModelFeed\n"
            "from ddptop.client.targets import resolve\n"
            "target = resolve(sys.argv[1])\n"
            "feed = ModelFeed()\n"
            "src = LiveSource(target, token=auth.load_token())\n"
            "src.start(feed.emit)\n"
            "end = time.monotonic() + 20\n"
            "while feed.settled(range(4)) < 4 and time.monotonic() < end:\n"
            "    time.sleep(0.1)\n"
            "got = src.request_stacks(timeout=10)\n"
            "src.stop()\n"
            "mains = sorted(r for r, s in got.stacks.items()\n"
            "               if any(t.is_main and t.frames for t in s.threads))\n"
            "print(target.via_agents, mains, sorted(got.errors))\n")
    res = subprocess.run([sys.executable, "-c", code, job_id], env=job_env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_every_verb_through_one_connection_per_node(job_runner: JobRunner) -> None:
    job = job_runner.start("healthy", nproc=4, interval=INTERVAL, env=VIA_AGENT)
    snap = job.wait_for(served_by_the_agent_only, timeout=120)
    assert sorted(r["rank"] for r in snap["ranks"]) == [0, 1, 2, 3]
    assert stacks_through(job.env, job.job_id) == "True [0, 1, 2, 3] []"
    # Straight to the ranks, as before agents served, still works (and adds a peer per rank).
    direct = job.run_cli("snapshot", "--json", job.job_id, timeout=60)
    assert direct.returncode == 0, direct.stderr
    env_ranks = dict(job.env, DDPTOP_VIA="ranks")
    res = subprocess.run([sys.executable, "-m", "ddptop", "snapshot", job.job_id], env=env_ranks,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "4/4 ranks" in res.stdout, res.stderr
    bad = subprocess.run([sys.executable, "-m", "ddptop", "snapshot", job.job_id],
                         env=dict(job.env, DDPTOP_VIA="sideways"), capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.strip().splitlines() == ["ddptop: DDPTOP_VIA='sideways': use one of auto, agent, ranks"]


def test_a_stopped_rank_is_named_through_the_agent(job_runner: JobRunner) -> None:
    job = job_runner.start("healthy", nproc=4, interval=INTERVAL, env=VIA_AGENT)
    snap = job.wait_for(served_by_the_agent_only, timeout=120)
    pid = next(r["pid"] for r in snap["ranks"] if r["rank"] == 1)
    silent_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        finding, took = wait_unresponsive(job, 1, silent_at)
        live = live_view_stuck(job, 1)  # the dashboard's path, through the agent's stream
    finally:
        os.kill(pid, signal.SIGCONT)
    assert finding["title"].startswith("rank 1 is stopped (SIGSTOP): state T"), finding
    assert live.startswith("T"), live
    assert took <= LIMIT_S, f"named after {took:.2f} s"


def test_a_spawned_agent_serves_when_asked(runtime_dir: Path) -> None:
    """``python -m ddptop.agent --serve ADDR`` (the agent ``install()`` spawns, and the one
    the CPU bench runs) serves its ranks too, once told; its port is printed on stderr."""
    job_id = "spawned-serve"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with run_in_subprocess(4, job_id, interval_s=0.25, runtime_dir=runtime_dir):
        agent = subprocess.Popen([sys.executable, "-m", "ddptop.agent", "--job-id", job_id, "--seconds", "60",
                                  "--serve", "127.0.0.1"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert agent.stderr is not None
            line = agent.stderr.readline()  # bounded: the agent prints it at once, or exits
            assert "serving viewers on 127.0.0.1:" in line, line
            port = int(line.rsplit(":", 1)[1])
            target = resolve(job_id)
            target = replace(target, via_agents=True,
                             endpoints=[replace(e, agent_port=port) for e in target.endpoints])
            source = LiveSource(target)
            feed = ModelFeed(job_id, 4)
            source.start(feed.emit)
            try:
                deadline = time.monotonic() + 30
                while feed.settled(range(4), states=2, history=True) < 4 and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert feed.settled(range(4), states=2, history=True) == 4
                assert source.connections == 1
            finally:
                source.stop()
        finally:
            stop_tree(agent)
