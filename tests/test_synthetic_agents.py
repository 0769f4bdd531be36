"""The synthetic job's node agents: agents only (no socket per rank) up to 16,384 ranks.

Real sockets, real clients: the viewer reaches the ranks through the fake agents with
``DDPTOP_VIA=agent``, as a multi-node job is watched. Every wait is bounded and polls its
condition; every generator is stopped in a fixture (a subprocess generator runs in its own
process group, which the fixture kills).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddptop.client.targets import resolve
from ddptop.client.watch import live_snapshot
from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.finding import Finding
from ddptop.errors import UsageError
from ddptop.model.rank_view import STALE
from ddptop.protocol import StuckReport
from ddptop.testing.synthetic import (
    SyntheticJob,
    SyntheticProcess,
    ensure_fd_limit,
    fds_needed,
    run_in_subprocess,
)
from tests.jobs import wait_until
from tests.watched import Watched

HARD_LIMIT_HERE = 20_000  # `ulimit -Hn` of the machines this project runs on


def test_fd_math_fits_32768_ranks_only_behind_agents() -> None:
    # One listener per node agent of 8, plus one outside viewer's connection each.
    assert fds_needed(32768, 8, rank_servers=False) == 4096 * 2 + 64
    assert fds_needed(32768, 8, rank_servers=False, viewers=1) == 4096 * 4 + 64 < HARD_LIMIT_HERE
    assert fds_needed(32768, 8, rank_servers=True) > HARD_LIMIT_HERE
    assert fds_needed(1024) == 1024 * 2 + 64
    with pytest.raises(UsageError, match="ranks per agent"):
        SyntheticJob(16, "x", rank_servers=False)


def test_agents_only_in_process_serves_every_rank_through_its_agent(
        runtime_dir: Path, via_agent: None, watch: Callable[[str], Watched]) -> None:
    with SyntheticJob(64, "ao64", interval_s=0.2, runtime_dir=runtime_dir, ranks_per_agent=8,
                      rank_servers=False, steps_per_s=5.0) as job:
        assert job.agents is not None and len(job.agents.servers) == 8
        assert all(e.port == e.agent_port != 0 for e in job.endpoints)
        assert len({e.agent_port for e in job.endpoints}) == 8
        w = watch("ao64")
        assert w.source.connections == 8  # one per node, none per rank
        wait_until(lambda: w.read(lambda m: sum(v.state is not None for v in m.ranks.values())) == 64, 20,
                   "a state of every rank through the agents")
        first = w.read(lambda m: {r: v.state.step for r, v in m.ranks.items() if v.state})
        assert isinstance(first, dict)
        wait_until(lambda: w.read(lambda m: all(v.state is not None and v.state.step > first[r]
                                                for r, v in m.ranks.items())) is True,
                   20, "every rank's step to move in the agents' stream")
        hosts = w.read(lambda m: {v.state.host for v in m.ranks.values() if v.state})
        assert hosts == {f"synth{i:04d}" for i in range(8)}
        assert all(len(w.model.ranks[r].history) >= 2 for r in range(64))
        stacks = w.source.request_stacks(timeout=10)
        assert not stacks.errors and len(stacks.stacks) == 64


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.xdist_group("ranks-at-scale")  # never two generators of 16k+ ranks at once
def test_16384_ranks_agents_only_fit_the_fd_limit_and_every_rank_is_seen(
        runtime_dir: Path, via_agent: None, generators: list[SyntheticProcess]) -> None:
    n, agents = 16384, 16384 // 8
    ensure_fd_limit(agents + 256)  # this viewer: one socket per agent
    gen = run_in_subprocess(n, "ao16k", "healthy", 1.0, runtime_dir, extra_args=("--agents-only",),
                            ready_timeout=240)
    generators.append(gen)
    assert gen.banner.startswith(f"ready: job ao16k, {n} ranks")
    # Listeners only for the agents: far below one per rank (and below fds_needed's bound).
    open_fds = len(os.listdir(f"/proc/{gen.pid}/fd"))
    assert agents <= open_fds < fds_needed(n, 8, rank_servers=False), open_fds
    assert len(list(runtime_dir.glob("ao16k.*.json"))) == n
    target = resolve("ao16k")
    assert target.world_size == n and target.via_agents
    began = time.monotonic()
    snap = live_snapshot(target, None, 120)
    why = dict(list(snap.job.unreachable.items())[:5])
    assert sorted(s.rank for s in snap.ranks) == list(range(n)), f"{len(snap.ranks)} of {n}: {why}"
    assert not snap.job.unreachable
    assert time.monotonic() - began < 120


def _findings(w: Watched, kind: str) -> list[Finding]:
    now = time.time()
    found = w.read(lambda m: [f for f in findings_for_model(m, now) if f.kind == kind])
    assert isinstance(found, list)
    return found


@pytest.mark.parametrize("digest", [False, True], ids=["stream", "digest"])
def test_hang_names_the_rank_that_never_entered_the_collective(
        runtime_dir: Path, via_agent: None, generators: list[SyntheticProcess],
        watch: Callable[..., Watched], digest: bool) -> None:
    gen = run_in_subprocess(16, "hang", "hang", 0.2, runtime_dir, seed=5, ready_timeout=60,
                            extra_args=("--agents-only", "--ranks-per-agent", "4", "--desync-after", "1"))
    generators.append(gen)
    banner = re.search(r"odd rank (\d+), event at ([\d.]+)", gen.banner)
    assert banner, gen.banner
    odd, event_at = int(banner[1]), float(banner[2])
    assert odd != 0 and abs(event_at - time.time()) < 60
    w = watch("hang", digest)

    def named() -> bool:
        return any(f.ranks == [odd] for f in _findings(w, "collective_stall"))

    wait_until(named, 40, f"a collective_stall naming rank {odd}")
    stall = next(f for f in _findings(w, "collective_stall") if f.ranks == [odd])
    assert f"rank {odd} never entered it" in " ".join(stall.evidence), stall.evidence
    assert "all_reduce #" in stall.title and stall.title.endswith(f"rank {odd} never entered it")
    states = w.read(lambda m: {r: v.state for r, v in m.ranks.items()})
    assert isinstance(states, dict) and len(states) == 16
    top = states[0].collectives[0].seq
    assert states[odd].collectives[0].seq == top - 1 and not states[odd].collectives[0].pending
    assert all(s.collectives[0].pending[0].seq == top for r, s in states.items() if r != odd)
    assert (w.pulses() > 0) == digest  # the lane was used, or not asked for


@pytest.mark.parametrize("digest", [False, True], ids=["stream", "digest"])
def test_silent_rank_goes_stale_and_its_agent_says_where_it_is_stuck(
        runtime_dir: Path, via_agent: None, watch: Callable[..., Watched], digest: bool) -> None:
    with SyntheticJob(16, "silent", "silent", interval_s=0.2, runtime_dir=runtime_dir, desync_after_s=1.0,
                      seed=2, ranks_per_agent=4, rank_servers=False) as job:
        odd, event_at = job.odd_rank, job.event_at
        assert odd != 0 and event_at is not None
        w = watch("silent", digest)
        wait_until(lambda: w.read(lambda m: m.view(odd).status(time.time())) == STALE, 30,
                   f"rank {odd} stale")
        wait_until(lambda: any(f.ranks == [odd] for f in _findings(w, "rank_unresponsive")), 20,
                   f"a rank_unresponsive finding naming rank {odd}")
        finding = next(f for f in _findings(w, "rank_unresponsive") if f.ranks == [odd])
        assert finding.title.startswith(f"rank {odd} has not answered for")
        assert "fused_attention" in finding.title
        statuses = w.read(lambda m: m.statuses(time.time()))
        assert isinstance(statuses, dict)
        assert [r for r, s in statuses.items() if s != "running"] == [odd]
        stuck = w.read(lambda m: m.ranks[odd].stuck)
        assert isinstance(stuck, StuckReport) and stuck.since < event_at <= stuck.time
        # A viewer that attaches after the silence gets the stuck report in the agents' catch-up.
        late = watch("silent", digest)
        wait_until(lambda: late.read(lambda m: m.ranks.get(odd) is not None
                                     and m.ranks[odd].current_stuck() is not None) is True,
                   20, "the stuck report in a late viewer's catch-up")
        # Stale from the report, not from the clock: read at the moment of its last state
        # (both viewers), the rank is stale already, and no other rank is.
        for viewer in (w, late):
            at_last = viewer.read(lambda m: m.statuses(m.ranks[odd].received_at))
            assert isinstance(at_last, dict) and at_last[odd] == STALE
            assert [r for r, s in at_last.items() if s != "running"] == [odd]
        assert (w.pulses() > 0) == digest


def test_split_gives_each_node_agent_once_with_its_ranks_and_keeps_the_rest_direct() -> None:
    from ddptop.client.agents import split
    from ddptop.protocol import AGENT_HELLO_RANK
    from ddptop.store.discovery import Endpoint

    def ep(rank: int, host: str, agent_port: int) -> Endpoint:
        return Endpoint(job_id="j", rank=rank, world_size=6, host=host, port=40000 + rank, pid=100 + rank,
                        node=host, agent_port=agent_port)

    endpoints = [ep(3, "10.0.0.2", 7001), ep(0, "10.0.0.1", 7000), ep(5, "10.0.0.3", 0),
                 ep(1, "10.0.0.1", 7000), ep(2, "10.0.0.2", 7001), ep(4, "10.0.0.1", 7000)]
    direct, agents = split(endpoints, through_agents=True)
    assert [e.rank for e in direct] == [5]  # no agent serves it
    assert {(a.host, a.port, a.rank, a.node): ranks for a, ranks in agents.items()} == {
        ("10.0.0.1", 7000, AGENT_HELLO_RANK, "10.0.0.1"): [0, 1, 4],
        ("10.0.0.2", 7001, AGENT_HELLO_RANK, "10.0.0.2"): [2, 3]}
    assert split(endpoints, through_agents=False) == (endpoints, {})
