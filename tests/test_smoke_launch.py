"""The shortest real path: launch a 2-rank job, snapshot it, see steps advance."""

from __future__ import annotations

from tests.jobs import JobRunner


def test_launch_and_snapshot_two_ranks(job_runner: JobRunner) -> None:
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "30"})
    first = job.wait_ranks(2, timeout=60)
    assert first["job"]["id"] == job.job_id
    step0 = {r["rank"]: r["step"] for r in first["ranks"]}
    later = job.wait_for(lambda s: all(r["step"] > step0[r["rank"]] for r in s["ranks"]), timeout=30)
    assert {r["rank"] for r in later["ranks"]} == {0, 1}
