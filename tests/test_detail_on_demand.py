"""The rank detail screen fetches the rank's fresh state on demand in the digest lane (issue #23).

Real parts: a synthetic job whose node agents serve every rank (no socket per rank), a real
:class:`~ddptop.client.live.LiveSource` on the agents' digest lane, and the real dashboard
under ``App.run_test()``. Every wait is bounded and polls its condition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Static

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.protocol import RankState
from ddptop.source import StatesResult
from ddptop.testing.synthetic import SyntheticJob
from ddptop.tui.app import DdptopApp
from ddptop.tui.on_demand import FETCHING, OnDemand
from ddptop.tui.screens.detail import RankDetail

SIZE = (170, 60)
RANK = 3


async def until(pilot: Pilot[int], cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded wait while the app runs; the message says what did not happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"within {timeout}s: {what}")


def shown(app: DdptopApp) -> str:
    """The detail screen's text."""
    return str(app.screen.query_one("#detail-text", Static).render())


def lane_pulses(source: LiveSource) -> int:
    """States rebuilt from the agents' digests (0: the lane was not used)."""
    return sum(p.digest.pulses for p in source._agent_peers if p.digest is not None)


def spied(source: LiveSource) -> list[list[int]]:
    """The ranks of every request_states call (the real method still answers)."""
    calls: list[list[int]] = []
    real = source.request_states

    def spy(ranks: Sequence[int], timeout: float = 5.0) -> StatesResult:
        calls.append(list(ranks))
        return real(ranks, timeout)

    source.request_states = spy  # type: ignore[method-assign]
    return calls


def samples_at_open(app: DdptopApp) -> tuple[int, int]:
    """The rank's reporter sample count (on demand) and step (pulse) in the dashboard's model."""
    st = app.model.ranks[RANK].state
    assert st is not None
    return st.reporter.samples, st.step


def test_detail_fetches_the_fresh_state_in_digest_mode_and_says_when_it_cannot(
        runtime_dir: Path, via_agent: None) -> None:
    with SyntheticJob(16, "od16", interval_s=0.2, runtime_dir=runtime_dir, ranks_per_agent=8,
                      rank_servers=False, steps_per_s=5.0, fake_gpu=True) as job:
        source = LiveSource(resolve("od16"), connect_timeout=5.0, digest=True)
        calls = spied(source)
        app = DdptopApp(source)

        async def go() -> None:
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, lambda: len(app.model.ranks) == 16 and lane_pulses(source) > 0, 30,
                            "every rank seen and the digest lane in use")
                assert source.on_demand_stale(RANK)
                # The lane's copy: on-demand fields as of the catch-up; the agent samples on.
                before, step = samples_at_open(app)
                await until(pilot, lambda: samples_at_open(app)[1] > step, 10, "a newer sample (pulse)")
                app.open_detail(RANK)
                await until(pilot, lambda: isinstance(app.screen, RankDetail)
                            and app.screen.on_demand.state is not None, 20, "the fresh state")
                screen = app.screen
                assert isinstance(screen, RankDetail)
                assert calls[0] == [RANK]
                fresh = screen.on_demand.state
                assert isinstance(fresh, RankState) and fresh.rank == RANK
                # reporter.samples is on demand: only the fresh state has the newer count.
                assert fresh.reporter.samples > before
                text = shown(app)
                assert f"reporter {fresh.reporter.samples} samples" in text, text
                assert "env, loaders' progress and these: as of " in text, text
                assert "gpu temperature " in text and "°C" in text, text
                # The key asks again; never two requests in flight for one screen.
                await pilot.press("r")
                await until(pilot, lambda: len(calls) >= 2 and not screen.on_demand.fetching, 20,
                            "a second fresh state")
                assert not screen.on_demand.why, screen.on_demand.why
                # The agents go away: the next request fails, and the screen says why.
                job.stop()
                await until(pilot, lambda: all(p.sock is None for p in source._agent_peers), 20,
                            "the agents' connections to close")
                asked = len(calls)
                await pilot.press("r")
                # A request sent after the close, settled (one already in flight, from the timer,
                # makes the key wait for the next tick: REFRESH_S, well within the bound).
                await until(pilot, lambda: len(calls) > asked and not screen.on_demand.fetching
                            and bool(screen.on_demand.why), 20, "a request after the close to fail")
                text = shown(app)
                assert "not available: not connected; shown as of " in text, text
                assert "Traceback" not in text
                assert screen.on_demand.requests == len(calls)

        asyncio.run(go())


def test_on_demand_words() -> None:
    """How old the fields are, in words: fetching, as of, not available (with why)."""
    od = OnDemand(2)
    assert od.line() == FETCHING
    assert od.begin() and not od.begin()  # one in flight
    assert od.line() == FETCHING
    od.settle(StatesResult({}, {}, {2: "no answer within 5 s"}))
    assert od.line() == "not available: no answer within 5 s"
    state = RankState(rank=2, local_rank=2, world_size=4, host="h", pid=1)
    assert od.begin()
    od.settle(StatesResult({2: state}, {2: 0.0}, {}))
    assert od.line().startswith("as of ") and od.state is state
    assert od.begin()
    assert od.line().endswith(f"({FETCHING})")
    od.settle(StatesResult({}, {}, {}))
    assert od.line().startswith("not available: no state in the answer; shown as of ")
    assert od.requests == 3
