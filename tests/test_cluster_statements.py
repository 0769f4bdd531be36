"""The cluster's own words (#54), each shape on real lines: SLURM's, Open MPI's, Horovod's,
torchrun's agent's, DeepSpeed's launcher's.

The lines come from the tune half of the #54 split (tests/data/logs_heldout/tune3, its
SOURCE.md names each thread); a shape it does not hold is taken from the public thread named
beside it. The holdout half (holdout3) is not read here. Pure: no job, no cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddptop.bundle.reader import build_model, end_time
from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.story import blames, culprits
from ddptop.evidence.cluster_claims import cluster_claims
from ddptop.evidence.log_lines import parse_lines
from ddptop.evidence.scan import load_evidence
from ddptop.model.outcome import PEER_GONE

TUNE3 = Path(__file__).parent / "data" / "logs_heldout" / "tune3"


def tune3(name: str) -> str:
    return (TUNE3 / f"{name}.log").read_text()


def findings_of(text: str, tmp_path: Path) -> list[Finding]:
    path = tmp_path / "console.log"
    path.write_text(text)
    contents = load_evidence([path])
    return findings_for_model(build_model(contents), end_time(contents), claims=contents.log_claims)


def test_srun_names_the_tasks_it_says_ran_out_of_memory_as_those_ranks(tmp_path: Path) -> None:
    text = tune3("slurm-oom-kill-tasks-1-3-step-cancelled")
    (claim,) = [c for c in cluster_claims(parse_lines(text)) if c.culprits]
    assert claim.kind == "slurm_oom" and claim.culprits == [1, 2, 3] and claim.place == "nid001277"
    (first, *_rest) = findings_of(text, tmp_path)
    assert blames(first) and culprits(first) == {1, 2, 3} and "nid001277" in first.title, first


def test_a_task_of_srun_over_torchrun_is_a_node_s_launcher_not_a_rank(tmp_path: Path) -> None:
    """srun starting torchrun per node: its task 1 is node 1's agent; nothing names a rank."""
    text = tune3("slurm-oom-kill-tasks-1-3-step-cancelled") + tune3("torchrun-sighup-death-signal-nohup")
    oom = [c for c in cluster_claims(parse_lines(text)) if c.kind == "slurm_oom"]
    assert oom and not any(c.culprits for c in oom), oom
    assert not any(blames(f) for f in findings_of(text, tmp_path))


def test_a_batch_step_s_oom_kill_names_no_rank_and_says_so(tmp_path: Path) -> None:
    found = findings_of(tune3("slurm-oom-kill-batch-step-no-task"), tmp_path)
    assert not any(blames(f) for f in found)
    assert "487912.batch" in found[0].title and found[-1].kind == "no_culprit", [f.title for f in found]


def test_the_first_process_the_launcher_names_is_that_rank_certain(tmp_path: Path) -> None:
    found = findings_of(tune3("determined-horovod-first-process-1"), tmp_path)
    assert blames(found[0]) and culprits(found[0]) == {1} and "Horovod's launcher" in found[0].title, found[0]


def test_horovod_s_shutdown_is_a_consequence_never_its_rank_s_failure(tmp_path: Path) -> None:
    text = tune3("horovod-shutdown-tf-warnings-no-rank")
    line = next(ln for ln in text.splitlines() if "Horovod has been shut down" in ln)
    assert PEER_GONE.search(line), "a rank with these last words is a victim, as after a lost peer"
    found = findings_of(text, tmp_path)
    assert not any(blames(f) for f in found)
    assert found[-1].kind == "no_culprit" and "consequence" in found[-1].title, found[-1]


@pytest.mark.parametrize(("name", "why"), [
    ("torchrun-sighup-death-signal-nohup", "signal from outside"),
    ("elastic-sigint-death-signal-user-interrupt", "signal from outside"),
    ("deepspeed-launcher-killing-eight-subprocesses", "killed every worker"),
    ("slurm-time-limit-job-and-step-cancelled", "SLURM ended the job"),
])
def test_a_trap_is_answered_with_what_was_recognised(name: str, why: str, tmp_path: Path) -> None:
    found = findings_of(tune3(name), tmp_path)
    assert not any(blames(f) for f in found)
    told = found[-1]
    assert told.kind == "no_culprit" and told.severity == "info" and why in told.title, told
    assert told.evidence and not told.ranks


def test_a_failed_node_is_the_answer_by_its_name(tmp_path: Path) -> None:
    """salloc's line as nebius/soperator#854 quotes it (a worker's node rebooted under the job)."""
    found = findings_of("salloc: error: Node failure on worker-1\n", tmp_path)
    assert found[0].kind == "node_lost" and "worker-1" in found[0].title and not found[0].ranks, found[0]
    assert not any(blames(f) for f in found)
