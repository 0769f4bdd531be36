"""A node agent that goes silent with its connection open is "unreachable", named by host.

A cut link, a dead switch port or a hung host closes nothing: the viewer's connections to
that host's node agent stay open and quiet. Here the host is a real synthetic job (its node
agents on real sockets) stopped whole with SIGSTOP, the one way on one machine to keep the
connections open while nothing answers: the viewer probes, then names every rank behind
those agents unreachable, with when they were last heard from, and the diagnosis names each
host; continued, the host answers and the finding goes. (The link cut between hosts, in
network namespaces: tests/test_three_hosts.py.) Every wait is bounded, on a condition.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddptop.client.reachability import UNREACHABLE_AFTER_S
from ddptop.diagnosis import findings_for_model
from ddptop.model.job import JobModel
from ddptop.testing.synthetic import SyntheticProcess, run_in_subprocess
from tests.jobs import wait_until
from tests.watched import Watched

N, PER_NODE = 16, 8


def _since(w: Watched) -> dict[int, float]:
    return dict(w.read(lambda m: m.snapshot(time.time()).job.unreachable_since))  # type: ignore[call-overload]


@pytest.mark.parametrize("digest", [False, True], ids=["subscribed", "digest"])
def test_a_host_silent_with_its_connections_open_is_named_unreachable_then_back(
        runtime_dir: Path, via_agent: None, generators: list[SyntheticProcess],
        watch: Callable[..., Watched], digest: bool) -> None:
    gen = run_in_subprocess(N, "cut16", "healthy", 0.5, runtime_dir,
                            extra_args=("--agents-only", "--ranks-per-agent", str(PER_NODE)))
    generators.append(gen)
    w = watch("cut16", digest=digest)
    wait_until(lambda: w.with_state() == N, 30, "a state of every rank through the agents")
    assert not _since(w)
    stopped = time.time()
    os.kill(gen.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: len(_since(w)) == N, 6 * UNREACHABLE_AFTER_S, "every rank unreachable")
        named = time.time() - stopped
        since = _since(w)
        # Last heard just before the stop (an agent sends every 0.5 s here), not when named.
        assert all(stopped - 3.0 <= t <= stopped + 0.5 for t in since.values()), (stopped, since)

        def unreachable(m: JobModel) -> list[tuple[list[int], str]]:
            found = findings_for_model(m, time.time())
            return [(f.ranks, f.title) for f in found if f.kind == "host_unreachable"]

        told = w.read(unreachable)
        assert isinstance(told, list)
        assert [ranks for ranks, _ in told] == [list(range(8)), list(range(8, 16))], told
        for (ranks, title), host in zip(told, ("synth0000", "synth0001"), strict=True):
            span = f"ranks {ranks[0]}-{ranks[-1]}"
            assert re.fullmatch(rf"host {host} unreachable since \d\d:\d\d:\d\d: {span}", title), title
        print(f"named unreachable {named:.1f} s after the host stopped")
    finally:
        os.kill(gen.pid, signal.SIGCONT)
    wait_until(lambda: not _since(w), 30, "the ranks reachable again once the host answers")
    assert w.read(lambda m: [f for f in findings_for_model(m, time.time())
                             if f.kind == "host_unreachable"]) == []
