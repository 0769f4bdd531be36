"""``job.json`` and the black box tell one story of how each rank ended.

A real node agent (in this process) records a synthetic job (a subprocess serving real
ranks over the real protocol, with real discovery files); then ``job.json`` as ``ddptop
jobs`` reads it is compared with the model that ``doctor`` and ``replay`` fold from the
record directory. Where the agent never saw a rank end before the command ended, it says so
in both: a ``lost`` connection event in the record, and ``lost`` in ``job.json`` read off the
same model; were the verdict only written into ``job.json`` (or only into the agent's model),
the two would disagree and this test fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddptop.agent.node import NodeAgent
from ddptop.agent.outcomes import LOST_AT_FINISH
from ddptop.bundle.record_dir import load_recording_model, read_recording
from ddptop.protocol import ConnectionEvent
from ddptop.status import ENDED, Status
from ddptop.store import jobrecord
from ddptop.testing.synthetic_process import run_in_subprocess

RANKS = 2
WAIT_S = 30.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll *condition* until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.05)


def heard_every_rank(agent: NodeAgent) -> bool:
    """The agent has a state of every rank in its model."""
    return all(agent.model.ranks.get(r) is not None and agent.model.ranks[r].state is not None
               for r in range(RANKS))


def told_apart(job_id: str) -> tuple[dict[int, str], dict[int, str]]:
    """(status by rank in job.json, status by rank in the model folded from the record)."""
    record = jobrecord.read_record(job_id)
    assert record is not None and record.end_time, record
    in_file = {o.rank: o.status for o in record.ranks}
    model, end = load_recording_model(jobrecord.job_dir(job_id))
    in_record = {r: s for r, s in model.statuses(end).items() if r in in_file}
    return in_file, in_record


@pytest.mark.parametrize("ranks_end_first", [False, True], ids=["never-ended", "ended"])
def test_job_json_and_the_record_agree_on_every_ending(runtime_dir: Path, ranks_end_first: bool) -> None:
    job_id = "agree-ended" if ranks_end_first else "agree-lost"
    job = run_in_subprocess(RANKS, job_id, interval_s=0.25, runtime_dir=runtime_dir)
    agent = NodeAgent(job_id, ["train.py"], 4 << 20)
    try:
        agent.start()
        wait_until(lambda: heard_every_rank(agent), "a state of every rank")
        if ranks_end_first:
            job.stop()
            wait_until(lambda: agent.ranks_running == 0, "every rank's exit")
        agent.finish(0 if ranks_end_first else 1, grace_s=0)
    finally:
        job.stop()
    in_file, in_record = told_apart(job_id)
    assert sorted(in_file) == list(range(RANKS)), in_file
    assert in_file == in_record
    assert all(status in ENDED for status in in_file.values()), in_file
    verdicts = [e for e in read_recording(jobrecord.job_dir(job_id)).events
                if isinstance(e, ConnectionEvent) and e.reason == LOST_AT_FINISH]
    if ranks_end_first:  # every end was seen: nothing to decide at the finish
        assert verdicts == [], verdicts
    else:  # still running when the command "ended": lost, by an event both read
        assert set(in_file.values()) == {Status.LOST}, in_file
        assert sorted(e.rank for e in verdicts) == list(range(RANKS))
        assert all(e.status == Status.LOST for e in verdicts)
