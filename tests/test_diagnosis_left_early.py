"""A rank that ended outside any collective while its peers waited for it in the next one (#45).

Rank 2 ended after collective #105 at step 100; ranks 0-1,3 entered #106 and were torn down
there. How rank 2 ended is the verdict: "exited cleanly" only with status 0 (then the ranks
ran different numbers of collectives: ``collective_mismatch``); with another status (its
``sys.exit`` message where its last words have it) or by a signal, that end is the cause
(``rank_lost``), and the waiting ranks are its victims. Constructed states, as a job's record
gives them after the end (srun, ``ddptop.install()``, no torchrun).
"""

from __future__ import annotations

from typing import Any

from ddptop.diagnosis import DiagnosisConfig, diagnose
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.rules_divergence import collective_divergence
from ddptop.diagnosis.rules_postmortem import rank_lost
from ddptop.model.job import JobModel
from ddptop.model.snapshot import JobSnapshot, build_snapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankExit, RankState, StateMsg
from ddptop.status import Status

NOW = 1_000_000.0
MESSAGE = "SystemExit('rank 2: bad shard 7')\n  sys.exit at /job/train.py:88 in load_shard"


def op(seq: int, state: str = "completed") -> PendingOp:
    return PendingOp(seq=seq, op="gloo:all_reduce", sizes=[[[1024]]], dtype="Float", state=state,
                     started_at=NOW - 30 + seq * 0.1, age_s=20.0 if state == "started" else 0.0)


def waiting(r: int) -> RankState:
    """Entered #106 and waited there until the launcher's SIGTERM (its last words)."""
    group = CollectiveGroup(pg="0", seq=106, recent=[op(104), op(105), op(106, "started")],
                            pending=[op(106, "started")])
    return RankState(rank=r, local_rank=r, world_size=4, host="h", pid=100 + r, time=NOW - 5, step=101,
                     status=Status.TORN_DOWN, exit_signal="SIGTERM", exit_reason="terminated by SIGTERM",
                     exited_at=NOW - 5, collectives=[group])


def left(**how: Any) -> RankState:
    """Rank 2, ended after #105 at step 100, outside any op."""
    group = CollectiveGroup(pg="0", seq=105, recent=[op(104), op(105)])
    return RankState(rank=2, local_rank=2, world_size=4, host="h", pid=102, time=NOW - 25, step=100,
                     exited_at=NOW - 25, collectives=[group], **how)


def snapshot(rank2: RankState) -> JobSnapshot:
    return build_snapshot("j", 4, [waiting(0), waiting(1), rank2, waiting(3)], {}, NOW)


def early(rank2: RankState) -> list[Finding]:
    return collective_divergence(snapshot(rank2), {}, NOW, DiagnosisConfig())


AFTER = (" after collective #105 at step 100, while ranks 0-1,3 entered #106 (all_reduce [1024] float32) "
         "and waited for rank 2 there")


def test_status_0_is_an_exit_cleanly_the_ranks_ran_different_numbers_of_collectives() -> None:
    (f,) = early(left(status=Status.EXITED, exit_code=0))
    assert (f.kind, f.ranks, f.victims, f.step) == ("collective_mismatch", [2], [0, 1, 3], 100)
    assert f.title == f"rank 2 exited cleanly{AFTER}: the ranks ran different numbers of collectives"


def test_an_exit_whose_status_nobody_read_is_not_called_clean() -> None:
    (f,) = early(left(status=Status.EXITED))
    assert f.kind == "collective_mismatch" and "cleanly" not in f.title
    assert f.title.startswith(f"rank 2 exited (its exit status unknown){AFTER}"), f.title


def test_status_1_with_its_message_is_the_cause_rank_lost() -> None:
    (f,) = early(left(status=Status.CRASHED, exit_code=1, exit_reason=MESSAGE))
    assert (f.kind, f.severity, f.certain) == ("rank_lost", "critical", True)
    assert (f.ranks, f.victims, f.step) == ([2], [0, 1, 3], 100)
    assert f.title == f"rank 2 exited with status 1: SystemExit('rank 2: bad shard 7'){AFTER}"
    assert "rank 2: sys.exit at /job/train.py:88 in load_shard" in f.evidence
    assert "rank 0: last collective #106 (all_reduce [1024] float32), step 101, torn_down" in f.evidence


def test_a_status_without_a_message_is_told_alone() -> None:
    """A bare ``raise SystemExit(3)`` or ``os._exit(3)``: the node agent read the status, the rank
    left no message."""
    (f,) = early(left(status=Status.CRASHED, exit_code=3))
    assert f.kind == "rank_lost" and f.title == f"rank 2 exited with status 3{AFTER}"


def test_a_signal_is_a_death_by_that_signal() -> None:
    (f,) = early(left(status=Status.CRASHED, exit_signal="SIGSEGV", exit_reason="Segmentation fault"))
    assert (f.kind, f.ranks, f.victims) == ("rank_lost", [2], [0, 1, 3])
    assert f.title == f"rank 2 died of SIGSEGV{AFTER}"


def test_an_exception_is_left_to_the_post_mortem_with_its_traceback() -> None:
    assert early(left(status=Status.CRASHED, exit_code=1, exit_reason="ValueError: planted failure")) == []


def test_stopped_from_outside_or_torn_down_is_not_leaving_early() -> None:
    for how in ({"status": Status.TERMINATED, "exit_signal": "SIGTERM"},
                {"status": Status.TORN_DOWN, "exit_signal": "SIGKILL"}):
        assert early(left(**how)) == [], how


def test_the_whole_diagnosis_leads_with_rank_2s_exit_and_never_calls_it_clean() -> None:
    snap = snapshot(left(status=Status.CRASHED, exit_code=1, exit_reason=MESSAGE))
    found = [f for f in diagnose(snap, {}, NOW) if f.at_least("warning")]
    lead = found[0]
    assert (lead.kind, lead.ranks, lead.victims) == ("rank_lost", [2], [0, 1, 3]), lead
    assert lead.title == f"rank 2 exited with status 1: SystemExit('rank 2: bad shard 7'){AFTER}", lead
    assert not any("cleanly" in f.title for f in found), [f.title for f in found]
    # No victim is blamed with certainty anywhere.
    assert not [f for f in found if f.certain and set(f.ranks) - set(f.victims) - {2}], found
    # The post-mortem's own word on rank 2 (the first failure) says its status and message too.
    post = rank_lost(snap, {}, NOW, DiagnosisConfig())[0]
    assert post.title == ("rank 2 failed first, at step 100: exited with status 1: "
                          "SystemExit('rank 2: bad shard 7')")


def test_the_post_mortem_calls_an_exit_clean_only_with_status_0() -> None:
    running = [RankState(rank=r, local_rank=r, world_size=4, host="h", pid=100 + r, time=NOW - 1, step=50)
               for r in (0, 1, 3)]
    for code, words in ((0, "rank 2 exited cleanly while ranks 0-1,3 still run"),
                        (None, "rank 2 exited while ranks 0-1,3 still run")):
        snap = build_snapshot("j", 4, [*running, left(status=Status.EXITED, exit_code=code)], {}, NOW)
        (f,) = rank_lost(snap, {}, NOW, DiagnosisConfig())
        assert (f.severity, f.title) == ("info", words), f
    alone = build_snapshot("j", 2, [running[0], left(status=Status.EXITED, exit_code=0)], {}, NOW)
    (f,) = rank_lost(alone, {}, NOW, DiagnosisConfig())
    assert f.title == "rank 2 exited cleanly while rank 0 still runs"


def test_the_ranks_own_status_stands_where_its_node_agent_could_not_read_one() -> None:
    """Its last words say ``sys.exit``'s status; the agent saw the process go, its status unread
    (an older kernel, reaped first): the rank's word stands. Where the agent read one, it wins."""
    model = JobModel(job_id="j", world_size=4)
    model.apply(StateMsg(state=left(status=Status.CRASHED, exit_code=1, exit_reason=MESSAGE)))
    model.apply(RankExit(time=NOW - 25, rank=2, pid=102))
    s = model.snapshot(NOW).by_rank()[2]
    assert (s.status, s.exit_code, s.exited_at) == (Status.CRASHED, 1, NOW - 25)
    model.apply(RankExit(time=NOW - 25, rank=2, pid=102, exit_code=0))  # caught, then ended well
    s = model.snapshot(NOW).by_rank()[2]
    assert (s.status, s.exit_code) == (Status.EXITED, 0)
