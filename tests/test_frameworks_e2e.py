"""Real trainers under `ddptop launch`: the training loader, steps, epoch and batch are right.

Each framework runs for real on CPU (gloo, 2 ranks) from the pinned test extras:
Lightning DDP, Hugging Face Trainer, FSDP2 ``fully_shard``, a plain loop with train and
validation loaders, gradient accumulation, a GradScaler-skipped step and
``torch.compile``, and a two-optimizer (GAN) loop. The probes (``probes/fw_*.py``)
train for a known number of batches, then hold (``common.hold_until_released``): the
test waits for every rank's hold marker, then for a snapshot sampled after it, and
compares the final numbers exactly. A planted unequal split in each training loader
must come out of ``ddptop doctor --json`` as ``unequal_batches``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.jobs import JobRunner, RunningJob, held_snapshot
from tests.test_probes_e2e import poll_doctor

pytest.importorskip("lightning")
pytest.importorskip("transformers")

NPROC = 2
# small_model(): Linear(32,W) + Linear(W,W) + Linear(W,10), weights and biases.


def _mlp_numel(width: int) -> int:
    return 32 * width + width + width * width + width + width * 10 + 10


@dataclass
class Expected:
    """The final numbers every rank must report."""

    probe: str
    env: dict[str, str]
    steps: int
    epochs: int  # passes over the training loader
    train_batches: int  # len(training loader) on each rank
    eval_lengths: list[int] = field(default_factory=list)  # lengths of the other loaders
    eval_passes: list[int] = field(default_factory=list)


CASES = {
    # 6 batches/epoch, 2 per step, 2 epochs; sanity check + 2 validations of 4 batches.
    "lightning": Expected("fw_lightning", {}, steps=6, epochs=2, train_batches=6,
                          eval_lengths=[4], eval_passes=[3]),
    # 12 batches sharded over 2 ranks: 6 per rank, 2 per step, 2 epochs; eval after each
    # epoch, on a loader the Trainer builds anew for every evaluation.
    "hf_trainer": Expected("fw_hf_trainer", {"HF_HUB_OFFLINE": "1"}, steps=6, epochs=2,
                           train_batches=6, eval_lengths=[3, 3], eval_passes=[1, 1]),
    # 5 batches, one step each, 2 epochs.
    "fsdp2": Expected("fw_fsdp2", {}, steps=10, epochs=2, train_batches=5),
    # 10 batches, 2 per step, 3 epochs = 15 steps (one of them skipped by GradScaler);
    # the validation loader is peeked at before training and run after every epoch.
    "plain_accum_compile": Expected("fw_loops", {"PROBE_MODE": "accum", "PROBE_COMPILE": "1"},
                                    steps=15, epochs=3, train_batches=10,
                                    eval_lengths=[3], eval_passes=[4]),
    # 8 batches, two optimizers per batch, 2 epochs: 16 steps, not 32.
    "two_optimizers": Expected("fw_loops", {"PROBE_MODE": "gan", "PROBE_TRAIN": "8", "PROBE_EPOCHS": "2"},
                               steps=16, epochs=2, train_batches=8),
}



def _start(job_runner: JobRunner, case: Expected, tmp_path: Path, unequal: bool) -> tuple[RunningJob, Path]:
    release = tmp_path / "release"
    env = {"PROBE_SECONDS": "150", "PROBE_RELEASE": str(release), **case.env}
    if unequal:
        # Slower steps keep the job in its first epoch while doctor looks.
        env.update({"PROBE_UNEQUAL": "1", "PROBE_TRAIN": "40", "PROBE_STEP_SLEEP": "0.2"})
    return job_runner.start(case.probe, nproc=NPROC, env=env), release


# Lightning and the HF Trainer in make test; the other loops are long variants (make test-long).
REAL = ("lightning", "hf_trainer")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n if n in REAL else pytest.param(n, marks=pytest.mark.long) for n in CASES])
def test_training_loader_steps_epoch_batch(job_runner: JobRunner, tmp_path: Path, name: str) -> None:
    """After training, every rank reports the training loader's numbers, not an evaluation loader's."""
    case = CASES[name]
    job, release = _start(job_runner, case, tmp_path, unequal=False)
    snap = held_snapshot(job, release, NPROC, timeout=150)
    for r in snap["ranks"]:
        where = f"{name} rank {r['rank']}"
        assert r["reporter"]["errors"] == 0, (where, r["reporter"]["last_error"])
        assert r["step"] == case.steps, (where, r["step"], r["loaders"])
        assert r["batches_per_epoch"] == case.train_batches, (where, r["loaders"])
        assert r["epoch"] == case.epochs - 1, (where, r["loaders"])
        assert r["batch"] == case.train_batches, (where, r["loaders"])
        train = [i for i in r["loaders"] if i["role"] == "train"]
        assert len(train) == 1, (where, r["loaders"])
        (t,) = train
        assert (t["length"], t["passes"], t["passes_completed"]) == (case.train_batches, case.epochs,
                                                                      case.epochs), (where, t)
        assert t["steps"] == case.steps, (where, t)
        others = sorted((i["index"], i["length"], i["passes"]) for i in r["loaders"] if i["role"] != "train")
        assert [length for _, length, _ in others] == case.eval_lengths, (where, r["loaders"])
        assert [passes for _, _, passes in others] == case.eval_passes, (where, r["loaders"])
        assert all(i["role"] == "eval" for i in r["loaders"] if i["role"] != "train"), (where, r["loaders"])
    if name == "fsdp2":
        fps = [r["param_fingerprint"] for r in snap["ranks"]]
        assert all(fp is not None and fp["wrapper"] == "fully_shard" for fp in fps), fps
        # Width 33: dim-0 shards of 17 and 16 rows, yet the global shapes agree.
        assert {fp["shapes_hash"] for fp in fps} == {fps[0]["shapes_hash"]}, fps
        assert all(fp["numel"] == _mlp_numel(33) and fp["dtensors"] == fp["count"] == 6 for fp in fps), fps
    release.touch()
    assert job.wait(timeout=60) == 0, job.log()[-3000:]


@pytest.mark.slow
# All in `make test-long`: in `make test` the rule is walked by F5 (tests/test_probes_e2e.py) and
# each real framework's training loader by test_training_loader_steps_epoch_batch.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long)
                                  for n in ("lightning", "hf_trainer", "fsdp2", "plain_accum_compile")])
def test_planted_unequal_training_split_is_flagged(job_runner: JobRunner, tmp_path: Path, name: str) -> None:
    """Rank 1's training loader is shorter: doctor names it as unequal_batches."""
    case = CASES[name]
    job, _release = _start(job_runner, case, tmp_path, unequal=True)
    run, _seen = poll_doctor(job, lambda run: bool(run.of("unequal_batches")), timeout=120)
    (finding,) = run.of("unequal_batches")
    assert finding["severity"] == "critical"
    assert 1 in finding["ranks"], finding
    snap = job.snapshot()
    lengths = {r["rank"]: r["batches_per_epoch"] for r in snap["ranks"]}
    assert lengths[0] is not None and lengths[1] is not None and lengths[1] < lengths[0], lengths
