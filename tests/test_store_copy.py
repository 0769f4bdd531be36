"""A viewer on a host of a multi-host job sees the whole job from its node agent's copy of the
job's store (#45): ``doctor MASTER_ADDR:PORT`` or ``doctor JOB`` there asks no store (whose client
is torch's: seconds to import, half a minute on a busy machine), so a doctor started after a cut
is done in time. The copy stands only where it names this host's live ranks as they are.

Real discovery entries of live processes (this test's own pid stands for the local ranks), a
real ``store.json`` as the agent writes it, and a store address where nothing listens: a store
read would fail there.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ddptop.client import targets
from ddptop.errors import TargetNotFound
from ddptop.store import discovery, jobrecord, proc_start
from ddptop.store.discovery import Endpoint
from ddptop.store.jobrecord import JobRecord
from tests.ports import unused_port

JOB = "multi"


def _endpoints(store: str) -> tuple[list[Endpoint], list[Endpoint]]:
    """Ranks 0-1 here (live: this process), ranks 2-3 on host b."""
    me, ticks = os.getpid(), proc_start.own_start_ticks()
    here = [Endpoint(job_id=JOB, rank=r, world_size=4, host="192.0.2.1", port=40000 + r, pid=me,
                     node="host-a", agent_port=41000, store=store, proc_start=ticks) for r in (0, 1)]
    there = [Endpoint(job_id=JOB, rank=r, world_size=4, host="192.0.2.2", port=40000 + r, pid=2_000_000 + r,
                      node="host-b", agent_port=41000, store=store) for r in (2, 3)]
    return here, there


def test_the_whole_job_comes_from_the_agents_copy_of_its_store(runtime_dir: Path) -> None:
    store = f"127.0.0.1:{unused_port()}"  # nothing listens: only the copy can answer
    here, there = _endpoints(store)
    for e in here:
        discovery.write_entry(e)
    jobrecord.write_record(JobRecord(job_id=JOB, host="host-a", start_time=1.0))
    jobrecord.write_store_copy(JOB, store, 4, here + there)
    assert oct((jobrecord.job_dir(JOB) / jobrecord.STORE_COPY_FILE).stat().st_mode & 0o777) == "0o600"
    for target in (store, JOB):  # by the store's address, by the job's id
        made = targets.resolve(target, store_timeout_s=0.5)
        assert (made.job_id, made.world_size, made.via_agents) == (JOB, 4, True), target
        assert [(e.rank, e.node) for e in made.endpoints] == [(0, "host-a"), (1, "host-a"), (2, "host-b"),
                                                             (3, "host-b")], target
        assert made.record == jobrecord.job_dir(JOB)  # this host's record of it: the agent's verdicts


def test_a_copy_that_is_not_the_jobs_as_it_is_is_not_taken(runtime_dir: Path) -> None:
    """A rank restarted here (a new endpoint), a copy of another store, a copy made before every
    rank published: none stands for the job; the store is asked, and where it cannot be, it is said."""
    store = f"127.0.0.1:{unused_port()}"
    here, there = _endpoints(store)
    restarted = [dataclasses.replace(e, port=e.port + 100) for e in here]
    for copied_at, copied, live in ((store, here + there, restarted), ("127.0.0.1:1", here + there, here),
                                    (store, here + there[:1], here)):
        jobrecord.write_store_copy(JOB, copied_at, 4, copied)
        assert targets.copied_store(JOB, store, live) is None, (copied_at, len(copied))
    jobrecord.write_store_copy(JOB, store, 4, here + there)
    assert targets.copied_store(JOB, store, here) is not None
    for e in restarted:
        discovery.write_entry(e)
    with pytest.raises(TargetNotFound, match=f"no ddptop job published at {store}"):
        targets.resolve(store, store_timeout_s=0.5)
