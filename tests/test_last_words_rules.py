"""The ranks' last words about their collectives (#20 item 2): gloo's size check and NCCL's
watchdog, read from exit reasons and from a job's stderr, named as collective_mismatch or
collective_stall with each side's op and size.

The gloo text is what a real run printed (probes/size_mismatch.py, probes/unequal_eval.py;
their e2e tests run it). NCCL's watchdog line cannot be produced on this machine (no GPU): its
lines below are built field by field as ProcessGroupNCCL.cpp builds them
(``"[Rank " rank "] Watchdog caught collective operation timeout: " << work << " ran for " ms
" milliseconds before timing out."``, ``WorkNCCL(SeqNum=, OpType=, NumelIn=, NumelOut=,
Timeout(ms)=)``), behind torchrun's ``[rankN]:`` prefix and glog's ``[E...]`` header."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddptop.diagnosis import DiagnosisConfig, diagnose
from ddptop.diagnosis.rules_last_words import gloo_size_mismatch
from ddptop.diagnosis.rules_watchdog import watchdog_timeout
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import CollectiveGroup, LoaderInfo, PendingOp, RankState
from tests.jobs import ddptop_cmd

NOW = 1_000_000.0
ENFORCE = ("gloo enforce failed: op.preamble.length <= op.nbytes. 1092 vs 4. Received data size doesn't "
           "match expected size. Is there a distributed collective mismatch in your code?")


def ended(r: int, reason: str, status: str = "terminated", **kw: Any) -> RankState:
    return RankState(rank=r, local_rank=r, world_size=4, host="h", pid=100 + r, time=NOW - 5, step=13,
                     status=status, exit_reason=reason, exited_at=NOW - 5 + r * 0.01, **kw)


def last_op(seq: int, numel: int) -> list[CollectiveGroup]:
    op = PendingOp(seq=seq, op="gloo:all_reduce", sizes=[[[numel]]], dtype="Float", state="started")
    return [CollectiveGroup(pg="0", seq=seq, recent=[op])]


def findings(states: list[RankState]) -> list[Any]:
    snap = build_snapshot("j", 4, states, {}, NOW)
    config = DiagnosisConfig()
    return gloo_size_mismatch(snap, {}, NOW, config) + watchdog_timeout(snap, {}, NOW, config)


def test_gloo_size_enforce_names_the_rank_with_the_extra_evaluation_batch() -> None:
    loaders = lambda n, b: [LoaderInfo(index=0, name="L", role="train", length=45, batch=45, steps=45),  # noqa: E731
                            LoaderInfo(index=1, name="V", role="eval", length=n, batch=b, passes=1)]
    states = [ended(r, "terminated by SIGTERM", collectives=last_op(64, 273), loaders=loaders(13, 13))
              for r in range(3)]
    states.append(ended(3, ENFORCE, status="crashed", loaders=loaders(14, 14)))
    (f,) = findings(states)
    assert (f.kind, f.ranks, f.step) == ("collective_mismatch", [3], 13)
    assert "expected 4 bytes where a peer sent 1092" in f.title and "all_reduce [273] float32" in f.title
    assert "batch 14 of evaluation loader #1, which has 13 batches on ranks 0-2" in f.title


def test_gloo_size_enforce_between_two_ranks_cannot_tell_which_diverged() -> None:
    (f,) = findings([ended(0, ENFORCE, status="crashed"), ended(1, "Connection closed by peer",
                                                               collectives=last_op(3, 273))])
    assert (f.kind, f.ranks) == ("collective_mismatch", [0, 1]) and "cannot be told" in f.title


def watchdog(rank: int, seq: int, op: str, numel: int) -> str:
    return (f"[rank{rank}]:[E1125 10:00:0{rank}.000000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for 60000{rank} milliseconds "
            "before timing out.")


def test_watchdog_lines_in_a_jobs_stderr_name_the_rank_in_another_op(tmp_path: Path) -> None:
    """`ddptop doctor LOG` on a torchrun log alone: ranks 0-2 timed out in ALLREDUCE at seq 808,
    rank 3 in BROADCAST at the same seq: rank 3 ran a different collective."""
    import subprocess

    lines = [watchdog(r, 808, "ALLREDUCE", 9801523) for r in range(3)] + [watchdog(3, 808, "BROADCAST", 5056)]
    log = tmp_path / "torchrun.log"
    log.write_text("W1125 10:00:00.000 torch/distributed/run.py:800] starting\n" + "\n".join(lines) + "\n")
    res = subprocess.run(ddptop_cmd("doctor", "--json", str(log)), capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 1, res.stderr
    found = json.loads(res.stdout)["findings"]
    f = found[0]
    assert (f["kind"], f["ranks"]) == ("collective_mismatch", [3]), found
    assert "BROADCAST of 5056 elements at seq 808" in f["title"] and "ALLREDUCE of 9801523" in f["title"], f


def test_watchdog_names_the_rank_that_never_reached_the_op_or_the_op_itself() -> None:
    never = [ended(r, watchdog(r, 12, "ALLREDUCE", 1), status="crashed") for r in range(3)]
    never.append(ended(3, "terminated by SIGTERM", collectives=last_op(11, 1)))
    (f,) = findings(never)
    assert (f.kind, f.ranks) == ("collective_stall", [3]) and "never reached it" in f.title
    said = "rank 3: no watchdog timeout at seq 12; its last collective: all_reduce [1] float32, seq 11"
    assert said in f.evidence, f.evidence
    every = [ended(r, watchdog(r, 12, "ALLREDUCE", 1), status="crashed") for r in range(4)]
    (g,) = findings(every)
    # Every rank in the same op: the collective is named, no rank (they are all its victims).
    assert (g.kind, g.ranks, g.victims) == ("collective_stall", [], [0, 1, 2, 3])
    assert "never completed" in g.title


def test_no_last_words_about_collectives_no_finding_and_the_engine_runs_them() -> None:
    states = [ended(r, "ValueError: boom" if r == 2 else "terminated by SIGTERM") for r in range(4)]
    assert findings(states) == []
    snap = build_snapshot("j", 4, [ended(0, ENFORCE, status="crashed"),
                                   ended(1, "x", collectives=last_op(3, 273))], {}, NOW)
    assert diagnose(snap, {}, NOW)[0].kind == "collective_mismatch"


def test_a_victims_lost_connection_names_the_host_and_ranks_at_that_address() -> None:
    """Ranks 0-1 on host-a failed with gloo's "Connection closed by peer [192.0.2.2]:port"; the
    job's store put ranks 2-3 at 192.0.2.2 on host-b. With host-b's ranks in the record, the
    victims' words are joined to them; without them (the agents could not exchange), the
    finding still names host-b and its ranks, not a local victim."""
    from ddptop.diagnosis.rules_postmortem import rank_lost

    closed = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
              "[192.0.2.2]:{port}")
    victims = [RankState(rank=r, local_rank=r, world_size=4, host="host-a", pid=10 + r, time=NOW - 5,
                         step=7, status="crashed", exit_reason=closed.format(port=40000 + r),
                         exited_at=NOW - 5 + r * 0.1, exit_code=1) for r in (0, 1)]
    places = {0: ("host-a", "192.0.2.1"), 1: ("host-a", "192.0.2.1"), 2: ("host-b", "192.0.2.2"),
              3: ("host-b", "192.0.2.2")}
    alone = build_snapshot("j", 4, victims, {2: "never seen", 3: "never seen"}, NOW, places)
    (f,) = rank_lost(alone, {}, NOW, DiagnosisConfig())
    assert f.ranks == [2, 3] and "lost their connection to host-b (192.0.2.2)" in f.title, f
    assert "rank 0 lost its connection to 192.0.2.2:40000: that is host-b (192.0.2.2), where ranks 2-3 ran" \
        in f.evidence, f.evidence
    killed = [RankState(rank=r, local_rank=r - 2, world_size=4, host="host-b", pid=10 + r, time=NOW - 6,
                        step=7, status="crashed", exit_signal="SIGKILL", exited_at=NOW - 6) for r in (2, 3)]
    whole = build_snapshot("j", 4, victims + killed, {}, NOW, places)
    (g,) = rank_lost(whole, {}, NOW, DiagnosisConfig())
    assert g.ranks[0] == 2 and "host-b" in g.title and "SIGKILL" in g.title, g
    assert any(line.startswith("rank 1 lost its connection to 192.0.2.2:40001") for line in g.evidence), g
    # Without the store's word, an address is only an address: no host is made up.
    bare = build_snapshot("j", 4, victims, {2: "never seen", 3: "never seen"}, NOW)
    (h,) = rank_lost(bare, {}, NOW, DiagnosisConfig())
    assert h.ranks == [2, 3] and "host-b" not in h.title and not any("that is" in e for e in h.evidence)


def test_a_job_the_scheduler_stopped_is_named_as_such_not_as_a_crash() -> None:
    """Every rank ended with SLURM's word (agent/scheduler.py: scontrol's JobState)."""
    from ddptop.diagnosis.rules_postmortem import rank_lost

    def stopped(cause: str) -> list[RankState]:
        return [RankState(rank=r, local_rank=r, world_size=4, host="n1", pid=10 + r, time=NOW - 5, step=40,
                          status="terminated", exit_signal="SIGTERM", exited_at=NOW - 5 + r * 0.01,
                          exit_cause=cause) for r in range(4)]

    def judged(cause: str) -> list[Any]:
        return rank_lost(build_snapshot("j", 4, stopped(cause), {}, NOW), {}, NOW, DiagnosisConfig())

    (cancel,) = judged("slurm_cancelled")
    assert (cancel.severity, cancel.ranks, cancel.step) == ("info", [0, 1, 2, 3], 40)
    assert "the job was cancelled by SLURM (scancel)" in cancel.title, cancel
    (limit,) = judged("slurm_timeout")
    assert limit.severity == "warning" and "time limit" in limit.title, limit
    (person,) = judged("")
    assert person.severity == "critical" and "SLURM" not in person.title, person
