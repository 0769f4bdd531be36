"""The reporter end to end: real torchrun jobs under `ddptop launch`, seen through `snapshot --json`.

The probes are unmodified training scripts (no ddptop import): everything checked here
comes from the injected reporter. Every wait is bounded and every job is owned by the
``job_runner`` fixture, which kills its process group at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ddptop.store import discovery
from tests.jobs import JobRunner, RunningJob, alone_on_host, ddptop_cmd
from tests.rank_connection import RankConnection

# The keys issue 2 promises in `ddptop snapshot --json` (a public interface).
RANK_KEYS = {"rank", "local_rank", "world_size", "host", "pid", "status", "step", "epoch", "batch",
             "batches_per_epoch", "data_wait_fraction", "loader_ready_batches", "collectives",
             "cpu_percent", "rss_bytes", "shm_used_bytes", "shm_total_bytes", "gpu", "versions",
             "param_fingerprint", "rng_fingerprint"}
# healthy.py: 2048 samples split over the ranks by DistributedSampler, batch size 16.
HEALTHY_SAMPLES, HEALTHY_BATCH = 2048, 16
# small_model(): Linear(32,64) + Linear(64,64) + Linear(64,10), weights and biases.
SMALL_MODEL_TENSORS, SMALL_MODEL_NUMEL = 6, 32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10
CUDA = False
try:  # the probes pick nccl with CUDA; op names and the gpu field follow
    import torch

    CUDA = bool(torch.cuda.is_available())
except ImportError:  # pragma: no cover - the test extra installs torch
    pass


def _ranks(snap: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r["rank"]): r for r in snap["ranks"]}


def _default_group(rank: dict[str, Any]) -> dict[str, Any]:
    groups = rank["collectives"]
    assert groups, f"rank {rank['rank']} reports no process group"
    return dict(groups[0])


def _endpoint(job: RunningJob, rank: int) -> discovery.Endpoint:
    for endpoint in discovery.read_entries():
        if endpoint.job_id == job.job_id and endpoint.rank == rank:
            return endpoint
    raise AssertionError(f"no discovery entry for rank {rank} of {job.job_id}")


@pytest.mark.slow
def test_every_field_of_a_four_rank_ddp_job(job_runner: JobRunner) -> None:
    """4 ranks, unmodified healthy.py: every snapshot field carries a real value."""
    world = 4
    job = job_runner.start("healthy", nproc=world, env={"PROBE_SECONDS": "45"})
    first = job.wait_ranks(world, timeout=90)
    assert first["job"]["id"] == job.job_id
    assert first["job"]["world_size"] == world
    before = {r: (s["step"], _default_group(s)["seq"]) for r, s in _ranks(first).items()}
    # Steps advance, and so does seq: healthy.py calls no dist.* in its loop, so only
    # DDP's C++ bucketed all-reduces can move it.
    snap = job.wait_for(lambda s: len(s["ranks"]) == world and all(
        r["step"] >= before[r["rank"]][0] + 3 and _default_group(r)["seq"] >= before[r["rank"]][1] + 3
        and r["rng_fingerprint"] is not None and r["param_fingerprint"] is not None
        and r["data_wait_fraction"] is not None
        for r in s["ranks"]), timeout=60)
    assert snap["job"]["backend"] == ("nccl" if CUDA else "gloo")
    assert snap["job"]["unreachable"] == {}
    ranks = _ranks(snap)
    assert sorted(ranks) == list(range(world))
    expected_batches = HEALTHY_SAMPLES // world // HEALTHY_BATCH
    for r, s in ranks.items():
        missing = RANK_KEYS - set(s)
        assert not missing, f"rank {r} lacks {missing}"
        assert s["local_rank"] == r and s["world_size"] == world  # one node: local == global
        assert s["host"] and s["pid"] > 0 and s["pid"] != os.getpid()
        assert s["status"] == "running"
        # epoch counts completed passes of the training loader: with the batch in this pass
        # it gives the step (one less while a batch is taken and its optimizer step not yet run)
        assert 0 <= s["epoch"] * expected_batches + s["batch"] - s["step"] <= 1, s
        assert s["batches_per_epoch"] == expected_batches  # len(loader)
        # 0 when the sample fell between a pass's last batch and the next pass's first (its
        # epoch already counted, the step equal to epoch x batches: the line above holds it).
        assert 0 <= s["batch"] <= expected_batches
        assert 0.0 <= s["data_wait_fraction"] <= 1.0
        assert s["step_time_s"] is not None and 0.0 < s["step_time_s"] < 5.0
        assert s["loader_ready_batches"] == 0  # num_workers=0: nothing is prefetched
        group = _default_group(s)
        assert group["pg"] == "0" and group["size"] == world
        assert group["seq"] >= s["step"]  # at least one all-reduce per step
        assert group["pending"] == []
        assert s["cpu_percent"] is not None and s["cpu_percent"] >= 0.0
        assert s["rss_bytes"] > 50 * 2**20  # torch alone is bigger than that
        assert s["shm_total_bytes"] is None or s["shm_total_bytes"] >= s["shm_used_bytes"] >= 0
        if CUDA:
            assert s["gpu"] is not None and s["gpu"]["name"]
        else:
            assert s["gpu"] is None
        assert s["versions"]["torch"].startswith("2.")
        assert s["versions"]["python"].count(".") == 2
        fp = s["param_fingerprint"]
        assert fp["wrapper"] == "DistributedDataParallel"
        assert (fp["count"], fp["numel"]) == (SMALL_MODEL_TENSORS, SMALL_MODEL_NUMEL)
        assert s["rng_fingerprint"]["torch"] and s["rng_fingerprint"]["python"]
        assert s["env"]["RANK"] == str(r)
        assert s["reporter"]["errors"] == 0, s["reporter"]["last_error"]
    # Same model and same seeds everywhere: the fingerprints must agree across ranks. The
    # RNG state is hashed when an epoch starts, so only ranks in the same epoch compare (a
    # snapshot can straddle an epoch boundary), and the last rank's epoch is always among them.
    assert len({s["param_fingerprint"]["shapes_hash"] for s in ranks.values()}) == 1
    by_epoch: dict[int, set[str]] = {}
    for s in ranks.values():
        by_epoch.setdefault(s["rng_fingerprint"]["epoch"], set()).add(s["rng_fingerprint"]["torch"])
    assert all(len(hashes) == 1 for hashes in by_epoch.values()), by_epoch
    assert len({s["pid"] for s in ranks.values()}) == world


@pytest.mark.slow
def test_pending_collective_age_and_stacks(job_runner: JobRunner) -> None:
    """Idle ranks show nothing pending; ranks waiting for a late peer show the op and its age."""
    release = job_runner.tmp / f"release-{uuid.uuid4().hex[:6]}"
    job = job_runner.start("pending_collective", nproc=2,
                           env={"PROBE_SECONDS": "60", "PROBE_RELEASE": str(release), "PROBE_STEPS": "5"})

    def idle_long_enough(s: dict[str, Any]) -> bool:
        # Both ranks finished training and seq has not moved for > FR read delay (2 s).
        return len(s["ranks"]) == 2 and all(
            r["step"] == 5 and r["collectives"] and r["time"] - r["collectives"][0]["seq_changed_at"] > 2.6
            for r in s["ranks"])

    idle = job.wait_for(idle_long_enough, timeout=90, interval=0.3)
    # An op that completed long ago must not look pending on a rank that merely sleeps
    # (gloo's Flight Recorder leaves every entry "scheduled").
    for s in idle["ranks"]:
        assert _default_group(s)["pending"] == [], f"idle rank {s['rank']} shows a pending op"
    idle_seq = _default_group(_ranks(idle)[0])["seq"]
    release.touch()  # the ranks idle until now: the state above is an idle one, not a race

    def waiting(s: dict[str, Any]) -> bool:
        r0 = _ranks(s).get(0)
        return r0 is not None and bool(r0["collectives"]) and bool(r0["collectives"][0]["pending"])

    snap = job.wait_for(waiting, timeout=60, interval=0.5)
    group0 = _default_group(_ranks(snap)[0])
    op = group0["pending"][0]
    assert op["op"] == ("nccl:all_gather" if CUDA else "gloo:all_gather")
    assert op["seq"] == group0["seq"] == idle_seq + 1
    assert op["sizes"] == [[[4]], [[2, 4]]]  # one 4-element input; FR flattens the outputs to [world, 4]
    assert op["dtype"] == "Float"
    assert op["age_s"] > 0.0
    assert op["timeout_s"] == pytest.approx(90.0)  # setup(timeout_s=PROBE_SECONDS + 30)
    # Rank 1 sleeps before the collective: it has not entered it, so nothing pending there.
    assert _default_group(_ranks(snap)[1])["pending"] == []
    assert _default_group(_ranks(snap)[1])["seq"] == idle_seq
    later = job.wait_for(lambda s: waiting(s) and _default_group(_ranks(s)[0])["pending"][0]["age_s"]
                         >= op["age_s"] + 1.0, timeout=20)
    assert _default_group(_ranks(later)[0])["pending"][0]["seq"] == op["seq"]

    # Stacks from the blocked rank: the reporter thread answers while the main thread
    # waits inside the collective, and the stack shows where.
    with RankConnection(_endpoint(job, 0), timeout=10) as conn:
        stacks = conn.stacks()
        trace = conn.fr_trace()
    assert stacks.rank == 0
    main = [t for t in stacks.threads if t.is_main]
    assert len(main) == 1
    functions = [f.function for f in main[0].frames]
    assert "all_gather" in functions, functions
    assert any(f.file.endswith("pending_collective.py") and f.function == "main" for f in main[0].frames)
    assert not any(t.name == "ddptop-reporter" for t in stacks.threads)
    assert trace.error == "" and '"entries"' in trace.json  # JSON text, not bytes' repr


@pytest.mark.slow
@pytest.mark.long  # 8 ranks on 2 cores: the four-rank tests walk the same path
def test_eight_ranks(job_runner: JobRunner) -> None:
    """The one 8-rank job: every rank answers and advances (kept short)."""
    world = 8
    job = job_runner.start("healthy", nproc=world, interval=0.5,
                           env={"PROBE_SECONDS": "40", "PROBE_STEP_SLEEP": "0.05"})
    first = job.wait_ranks(world, timeout=150)
    steps = {r["rank"]: r["step"] for r in first["ranks"]}
    snap = job.wait_for(lambda s: len(s["ranks"]) == world
                        and all(r["step"] > steps[r["rank"]] for r in s["ranks"]), timeout=60)
    assert sorted(_ranks(snap)) == list(range(world))
    assert snap["job"]["world_size"] == world and snap["job"]["answered"] == world
    assert all(r["batches_per_epoch"] == HEALTHY_SAMPLES // world // HEALTHY_BATCH for r in snap["ranks"])
    assert len({e.port for e in discovery.read_entries() if e.job_id == job.job_id}) == world


def test_snapshot_without_a_job_fails_in_one_line(tmp_path: Path) -> None:
    """No job on this host: non-zero exit, a one-line reason, nothing on stdout."""
    env = dict(os.environ, DDPTOP_RUNTIME_DIR=str(tmp_path / "empty"))
    res = subprocess.run(alone_on_host(ddptop_cmd("snapshot", "--json")), env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode != 0
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no ddptop job" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_snapshot_with_an_unreachable_rank_prints_partial_results(job_runner: JobRunner) -> None:
    """A rank that cannot answer (stopped) is named; the others are still printed; exit 3."""
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "45"})
    job.wait_ranks(2, timeout=90)
    victim = _endpoint(job, 1)
    # SIGSTOP rather than SIGKILL: torchrun would tear the whole job down after a kill,
    # and a frozen rank is the harder case (its record and port stay, it just never answers).
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        res = job.run_cli("snapshot", "--json", "--timeout", "2", job.job_id, timeout=60)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    assert res.returncode == 3, res.stderr
    snap = json.loads(res.stdout)
    # Every rank listed (#34): the frozen one with its last known state, stale; still named as
    # the one that did not answer.
    assert [(r["rank"], r["status"]) for r in snap["ranks"]] == [(0, "running"), (1, "stale")], snap["ranks"]
    assert list(snap["job"]["unreachable"]) == ["1"]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not answer: 1" in lines[0], res.stderr


@pytest.mark.slow
def test_snapshot_after_sigkill_of_a_rank(job_runner: JobRunner) -> None:
    """SIGKILL one rank: snapshot never hangs, exits non-zero, and names what it knows."""
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "45"})
    job.wait_ranks(2, timeout=90)
    victim = _endpoint(job, 1)
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while discovery.pid_alive(victim.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    res = job.run_cli("snapshot", "--json", "--timeout", "3", job.job_id, timeout=60)
    # torchrun may already be tearing rank 0 down; either way the reason is one line
    # and rank 1 is never reported as a healthy, running rank.
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    shown = json.loads(res.stdout)["ranks"] if res.stdout.strip() else []
    rank1 = {r["status"] for r in shown if r["rank"] == 1}
    assert rank1 <= {"lost", "crashed", "exited"}, rank1  # absent, or shown as gone


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
