"""Pilot tests of the dashboard attached to real `ddptop launch -- torchrun` jobs (slow)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.tui.app import DdptopApp
from ddptop.tui.screens.detail import RankDetail
from ddptop.tui.screens.stacks import StacksScreen
from ddptop.tui.widgets.rank_table import RankTable
from tests.jobs import JobRunner

pytestmark = pytest.mark.slow
SIZE = (170, 45)


async def until(pilot: Pilot[int], cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Bounded wait while the app runs; the message says what did not happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"within {timeout}s: {what}")


def statuses(app: DdptopApp) -> dict[int, str]:
    """Status word of every row in the table."""
    return {r.rank: r.status for r in app.query_one(RankTable).shown_rows}


# Through the node agents: the same table and keys, the agent lane walked in `make test` by
# tests/test_agent_e2e.py (every verb through one connection per node); this variant in `make test-long`.
@pytest.mark.parametrize("via", ["ranks", pytest.param("agent", marks=pytest.mark.long)])
def test_rows_detail_sort_filter_and_killed_rank_turns_lost(via: str, job_runner: JobRunner,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same dashboard whether it connects to every rank or once to the node agent."""
    job = job_runner.start("healthy", nproc=4, env={"PROBE_SECONDS": "90", "PROBE_STEP_SLEEP": "0.05"})
    job.wait_ranks(4, timeout=90)
    monkeypatch.setenv("DDPTOP_VIA", via)
    source = LiveSource(resolve(job.job_id))
    assert source.target.via_agents == (via == "agent")
    app = DdptopApp(source)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)
            await until(pilot, lambda: statuses(app) == dict.fromkeys(range(4), "running"), 30,
                        f"4 running rows (have {statuses(app)})")
            assert source.connections == (1 if via == "agent" else 4)
            assert job.job_id in str(app.query_one("#header", Static).render())
            await pilot.press("slash", *"1,3", "enter")
            await until(pilot, lambda: [r.rank for r in table.shown_rows] == [1, 3], 5, "filter 1,3")
            await pilot.press("slash", "ctrl+u", "enter")
            await until(pilot, lambda: len(table.shown_rows) == 4, 5, "filter cleared")
            await pilot.press("greater_than_sign")
            assert table.sort_key == "host"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RankDetail), 5, "detail opens")
            assert "versions" in str(app.screen.query_one("#detail-text", Static).render())
            await pilot.press("escape")
            victim = app.model.ranks[2].state
            assert victim is not None
            os.kill(victim.pid, signal.SIGKILL)
            await until(pilot, lambda: statuses(app).get(2) in ("lost", "crashed"), 30,
                        f"rank 2 lost (have {statuses(app)})")
            await until(pilot, lambda: any(w in str(app.query_one("#header", Static).render())
                                           for w in ("lost", "crashed")), 10, "the header to count it")

    asyncio.run(go())


def test_stacks_groups_ranks_blocked_in_a_collective(job_runner: JobRunner) -> None:
    job = job_runner.start("pending_collective", nproc=3,
                           env={"PROBE_SECONDS": "90", "PROBE_STEPS": "3", "PROBE_HOLD_S": "80"})
    job.wait_for(lambda s: len(s["ranks"]) == 3 and all(
        r["collectives"] and r["collectives"][0]["pending"] for r in s["ranks"] if r["rank"] != 1),
        timeout=90)
    app = DdptopApp(LiveSource(resolve(job.job_id)))

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(statuses(app)) == 3, 30, "3 rows")
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen.result is not None,
                        15, "stacks arrive")
            text = str(app.screen.query_one("#stacks-text", Static).render())
            lines = [line for line in text.splitlines() if line.startswith("rank")]
            assert any(line.startswith("ranks 0,2: ") and "all_gather" in line for line in lines), text
            assert any(line.startswith("rank 1: ") for line in lines), text
            await pilot.press("escape")
            pending = [line for line in (app.query_one(RankTable).render_line(y).text for y in range(5))
                       if "all_gather #" in line]
            assert len(pending) == 2

    asyncio.run(go())
