"""DeepSpeed ZeRO-2 as a first-class client (#47): real jobs under `ddptop launch -- torchrun`.

Two jobs of ``probes/fw_deepspeed.py`` (2 ranks, gloo, ``DS_ACCELERATOR=cpu``) serve the
module, started together once: one trains 3 tiny epochs through ``engine.deepspeed_io``
(a new torch DataLoader on every pass) and holds, then trains on with rank 1 stalled before
its step; the other holds right after ``deepspeed.initialize`` with rank 1's model wider
(a planted parameter mismatch). DeepSpeed's CPU shared-memory op is compiled by `make venv`
into ``<venv>/torch-extensions``, where these jobs find it (TORCH_EXTENSIONS_DIR); where it is
missing, the module's fixture compiles it once before any job starts (tests/deepspeed_op.py).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import deepspeed_op
from tests.jobs import JobRunner, RunningJob, held_snapshot
from tests.test_probes_e2e import poll_doctor, text_of

if importlib.util.find_spec("deepspeed") is None:  # never imported here: seconds of start-up
    pytest.skip("deepspeed is not installed (`make venv` installs the test extra)", allow_module_level=True)

# One worker runs the module, so its jobs are started once; the first test's set-up may include
# compiling DeepSpeed's op where `make venv` did not (tests/deepspeed_op.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deepspeed"), pytest.mark.timeout(1200)]

NPROC = 2
EPOCHS, BATCHES = 3, 5  # per rank: 5 batches of 4 from a DistributedSampler over 40 samples
NUMEL = 32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10  # the probes' small_model(64)
START_S = 180.0  # start-up and 3 tiny epochs (about 20 s on an idle 2-core machine)


@dataclass
class DeepSpeedJobs:
    """The module's two jobs and the files that release them."""

    trained: RunningJob
    trained_release: Path
    mismatched: RunningJob
    mismatched_release: Path


@pytest.fixture(scope="module")
def shm_op() -> None:
    """DeepSpeed's op, built once before any rank would compile it (`make venv` did, normally)."""
    if not deepspeed_op.built():
        deepspeed_op.build()


@pytest.fixture(scope="module")
def jobs(shm_op: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeepSpeedJobs]:
    runner = JobRunner(tmp_path_factory.mktemp("deepspeed"))
    trained_release, mismatched_release = runner.tmp / "trained", runner.tmp / "mismatched"
    try:
        trained = runner.start("fw_deepspeed", nproc=NPROC, env=job_env(
            trained_release, stall_rank="1", epochs=str(EPOCHS), train=str(BATCHES)))
        mismatched = runner.start("fw_deepspeed", nproc=NPROC,
                                  env=job_env(mismatched_release, mismatch_rank="1"))
        yield DeepSpeedJobs(trained, trained_release, mismatched, mismatched_release)
    finally:
        runner.stop_all()


def held_after_epochs(job: RunningJob, release: Path) -> dict[str, Any]:
    """*job*'s snapshot sampled after every rank finished its epochs (and holds)."""
    return held_snapshot(job, release, NPROC, START_S)


def job_env(release: Path, **probe: str) -> dict[str, str]:
    """The environment of a DeepSpeed probe job: the CPU accelerator, the venv's built op."""
    return {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(deepspeed_op.EXTENSIONS),
            "PROBE_SECONDS": str(int(START_S + 120)), "PROBE_PG_TIMEOUT": "120",
            "PROBE_RELEASE": str(release), **{f"PROBE_{key.upper()}": v for key, v in probe.items()}}


@pytest.fixture(scope="module")
def held(jobs: DeepSpeedJobs) -> dict[str, Any]:
    """The trained job's snapshot after its epochs."""
    return held_after_epochs(jobs.trained, jobs.trained_release)


def test_epoch_batch_and_fingerprint_of_a_zero2_engine(held: dict[str, Any]) -> None:
    """After 3 epochs of a loader rebuilt every pass: epoch 2, batch 5, one loader with 3 passes;
    every rank's fingerprint is the engine's, ZeRO stage 2, whole parameters, equal hashes."""
    fingerprints = []
    for r in held["ranks"]:
        where = f"rank {r['rank']}"
        assert r["reporter"]["errors"] == 0, (where, r["reporter"]["last_error"])
        assert (r["step"], r["epoch"], r["batch"], r["batches_per_epoch"]) == (EPOCHS * BATCHES, EPOCHS - 1,
                                                                               BATCHES, BATCHES), (where, r)
        (loader,) = r["loaders"]  # DeepSpeed's DataLoader of each pass continues the first one's entry
        assert loader["role"] == "train", (where, loader)
        assert (loader["passes"], loader["passes_completed"], loader["rebuilt"], loader["steps"]) == (
            EPOCHS, EPOCHS, EPOCHS - 1, EPOCHS * BATCHES), (where, loader)
        assert r["rng_fingerprint"]["epoch"] == EPOCHS - 1, (where, r["rng_fingerprint"])
        fp = r["param_fingerprint"]
        assert fp is not None, where
        assert (fp["wrapper"], fp["zero_stage"], fp["partitioned"]) == ("DeepSpeedEngine", 2, 0), (where, fp)
        assert fp["count"] == 6 and fp["numel"] == fp["held_numel"] == NUMEL, (where, fp)
        fingerprints.append(fp["shapes_hash"])
        # DeepSpeed trains on a data-parallel group of its own (a clone of the world).
        assert any(g["pg"] != "0" and g["size"] == NPROC and g["seq"] > 0 for g in r["collectives"]), (
            where, r["collectives"])
    assert len(set(fingerprints)) == 1, fingerprints


def test_a_planted_parameter_mismatch_is_named(jobs: DeepSpeedJobs) -> None:
    """Rank 1's model is wider: param_mismatch names it and the first parameter that differs."""
    job = jobs.mismatched
    job.wait_log(r"rank 1: initialising DeepSpeed \(wide model: True\)", timeout=START_S)
    run, _ = poll_doctor(job, lambda r: bool(r.of("param_mismatch")), timeout=120, watch=0.5)
    (finding,) = run.of("param_mismatch")
    assert finding["ranks"] == [1], finding
    text = text_of(finding)
    assert "0.weight" in text and "[80, 32]" in text and "[64, 32]" in text, finding
    job.stop()  # seen: its ranks need not hold (and sample) through the module's other tests


def test_a_stalled_rank_is_named_with_its_frame(jobs: DeepSpeedJobs, held: dict[str, Any]) -> None:
    """Released, rank 1 stops before its next step while rank 0 waits in ZeRO's gradient
    reduction: collective_stall names rank 1 (not rank 0) at the probe's frame; rank 0 is the
    one that waits. Released again, the job ends by itself."""
    job, release = jobs.trained, jobs.trained_release
    release.touch()
    job.wait_log(r"rank 1: stalling before its step", timeout=60)

    def named(run: Any) -> bool:
        return any(f["ranks"] == [1] and any("stall_before_step" in e for e in f["evidence"])
                   for f in run.of("collective_stall"))

    run, _ = poll_doctor(job, named, timeout=60)
    finding = next(f for f in run.of("collective_stall") if f["ranks"] == [1])
    frame = next(e for e in finding["evidence"] if "stall_before_step" in e)
    assert re.search(r"rank 1 is at probes/fw_deepspeed\.py:\d+ in stall_before_step", frame), frame
    assert re.match(r"rank 0 has waited .* in gloo:\w+ #\d+ of group \d+.*; rank 1 never entered it",
                    finding["title"]), finding
    assert finding["victims"] == [0], finding  # the one that waits, a victim (#45's wait-for graph)
    Path(f"{release}.stall").touch()
    assert job.wait(timeout=90) == 0, job.log()[-3000:]


@pytest.mark.long
def test_a_zero3_fingerprint_says_what_each_rank_holds(shm_op: None, job_runner: JobRunner,
                                                       tmp_path: Path) -> None:
    """ZeRO-3 partitions every parameter (no persistence threshold): global shapes and hash as
    under ZeRO-2, each rank holding half of the elements; the loader's epochs as before."""
    release = tmp_path / "release"
    job = job_runner.start("fw_deepspeed", nproc=NPROC, env=job_env(release, zero_stage="3"))
    snap = held_after_epochs(job, release)
    for r in snap["ranks"]:
        fp = r["param_fingerprint"]
        assert (fp["zero_stage"], fp["partitioned"], fp["count"], fp["numel"]) == (3, 6, 6, NUMEL), fp
        assert fp["held_numel"] == NUMEL // NPROC, fp  # every tensor's numel is even: no padding
        assert (r["epoch"], r["batch"], r["step"]) == (EPOCHS - 1, BATCHES, EPOCHS * BATCHES), r
    assert len({r["param_fingerprint"]["shapes_hash"] for r in snap["ranks"]}) == 1
    release.touch()
    assert job.wait(timeout=90) == 0, job.log()[-3000:]
