"""NCCL's RAS report, accelerate's launcher and Ray's workers (#54, second part), each shape on
the real lines of tests/data/logs_heldout/tune4 (its SOURCE.md names each thread).

What each statement names (a rank, a node, a worker) and whether it says a cause or only a
consequence; none of them makes a rank a certain cause, and doctor says what it recognised
(``no_culprit``). Pure: no job, no cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddptop.diagnosis.story import blames, culprits
from ddptop.evidence.cluster_claims import cluster_claims
from ddptop.evidence.log_lines import parse_lines
from ddptop.evidence.runtime_claims import runtime_claims
from tests.log_scoring import diagnose_path

TUNE4 = Path(__file__).parent / "data" / "logs_heldout" / "tune4"


def claims_of(name: str) -> list:  # type: ignore[type-arg]
    return runtime_claims(parse_lines((TUNE4 / f"{name}.log").read_text()))


def test_ras_mismatch_lists_ranks_without_blaming_them() -> None:
    """nccl#1911: the two ranks RAS lists launched one AllGather more; the thread says they are not
    the stragglers. Named, never culprits."""
    (claim,) = claims_of("nccl-ras-mismatch-two-ranks-ahead")
    assert claim.kind == "nccl_ras" and claim.named == [12, 13] and not claim.culprits
    assert "MISMATCH" in claim.words and "AllGather" in claim.words and claim.place == "10.137.190.124"
    found = diagnose_path(TUNE4 / "nccl-ras-mismatch-two-ranks-ahead.log")
    assert not any(blames(f) and culprits(f) & {12, 13} for f in found)
    assert found[-1].kind == "no_culprit" and "RAS" in found[-1].title


def test_ras_incomplete_names_the_silent_rank_s_node_as_a_place() -> None:
    (claim,) = claims_of("nccl-ras-incomplete-report-of-a-ras-bug")
    assert claim.kind == "nccl_ras" and claim.named == [1] and not claim.culprits
    assert "INCOMPLETE" in claim.words and "Missing communicator data from 255 ranks" in claim.words
    assert claim.place == "10.4.109.13"


def test_ras_ok_beside_a_watchdog_timeout_blames_no_one() -> None:
    (claim,) = claims_of("nccl-ras-ok-while-rank118-times-out")
    assert claim.kind == "nccl_ras_ok" and not claim.named
    found = diagnose_path(TUNE4 / "nccl-ras-ok-while-rank118-times-out.log")
    assert not any(blames(f) for f in found)
    assert "running without error" in found[-1].title, [f.title for f in found]


def test_accelerate_s_called_process_error_is_a_consequence() -> None:
    (claim,) = claims_of("accelerate-simple-launcher-calledprocesserror")
    assert claim.kind == "launcher_exit" and claim.source == "accelerate's launcher"
    assert "exit status 1" in claim.words and not claim.culprits


def test_a_called_process_error_outside_accelerate_is_not_accelerate_s() -> None:
    line = ("subprocess.CalledProcessError: Command '['where', 'cl']' returned non-zero exit status 1.")
    assert not runtime_claims(parse_lines(line + "\n"))


def test_accelerate_over_the_agent_says_it_stopped_with_its_workers_and_names_no_culprit() -> None:
    (claim,) = claims_of("accelerate-rich-sigkill-local-rank-5-memory")
    assert claim.kind == "launcher_exit" and "stopped with its workers" in claim.words
    found = diagnose_path(TUNE4 / "accelerate-rich-sigkill-local-rank-5-memory.log")
    assert not any(blames(f) for f in found) and found[-1].kind == "no_culprit"


def test_ray_actor_died_names_the_actor_its_pid_and_ip_never_a_rank() -> None:
    (claim,) = claims_of("ray-actor-died-after-first-epoch")
    assert claim.kind == "ray_actor_died" and not claim.culprits and claim.place == "10.7.34.138"
    assert "ActorModelRayActorBOX (pid 5226)" in claim.words


def test_ray_task_error_of_a_dead_actor_is_the_caller_s_words() -> None:
    (claim,) = claims_of("ray-taskrunner-actor-died-during-validation")
    assert claim.kind == "ray_task_error" and claim.place == "172.26.255.4"
    assert "ray::TaskRunner.run() (pid 20877) failed with ActorDiedError" in claim.words


def test_ray_s_memory_monitor_names_the_node_not_a_rank() -> None:
    (claim,) = claims_of("ray-memory-monitor-killed-vllm-worker")
    assert claim.kind == "ray_memory_kill" and claim.place == "node 169.254.181.2" and not claim.culprits
    assert "RayWorkerVllm.__init__ (pid 308" in claim.words and "12.49GB / 13.15GB" in claim.words


def test_ray_workers_cuda_error_out_of_memory_is_unranked() -> None:
    claims = claims_of("ray-actors-cuda-oom-vllm-wake-up")
    assert claims and {c.kind for c in claims} == {"gpu_oom"} and not any(c.culprits for c in claims)


@pytest.mark.parametrize("path", sorted(TUNE4.glob("*.log")), ids=lambda p: p.name)
def test_every_tune4_log_blames_no_one_and_says_what_it_recognised(path: Path) -> None:
    assert runtime_claims(parse_lines(path.read_text())) or cluster_claims(parse_lines(path.read_text()))
    found = diagnose_path(path)
    assert not any(blames(f) for f in found), [f.title for f in found]
    assert found[-1].kind == "no_culprit" and found[-1].title.startswith("recognised, no one blamed: ")
