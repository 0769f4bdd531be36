"""Every log shape people post (#33 item 3), read line by line, with what each proves of a rank.

The lines are real: each is taken from tests/data/logs (SOURCE.md names its thread), or,
for the shapes the corpus lacks, from the text torch's C++ formats (TraceUtils.h's desync
report, ProcessGroupWrapper's fingerprint) as the local torch 2.13 headers write it.
"""

from __future__ import annotations

from pathlib import Path

from ddptop.diagnosis import DiagnosisConfig
from ddptop.diagnosis import nccl_statements as nccl
from ddptop.diagnosis.rules_reports import desync_report, fingerprint_mismatch
from ddptop.diagnosis.rules_watchdog import watchdog_timeout
from ddptop.evidence.log_lines import parse_lines
from ddptop.evidence.log_statements import statements
from ddptop.evidence.torchrun_log import read_log
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankState

LOGS = Path(__file__).parent / "data" / "logs"
NOW = 1_000_000.0


def corpus(name: str) -> str:
    return next(LOGS.glob(f"{name}-*.log")).read_text()


def test_launcher_prefixes_give_the_global_rank_and_come_off() -> None:
    lines = parse_lines("[1,3]<stderr>:Traceback (most recent call last):\n"
                        "[default2]:[rank2]: RuntimeError: boom\n"
                        "[rank5]:[E1115 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught\n")
    assert [(ln.rank, ln.text[:9]) for ln in lines] == [(3, "Traceback"), (2, "RuntimeEr"), (5, "[E1115 Pr")]
    srun = parse_lines("0: step 1\n1: step 1\n3: RuntimeError: x\n")
    assert [ln.rank for ln in srun] == [0, 1, 3] and srun[2].text == "RuntimeError: x"
    # "3: " inside one line of a log that has no such prefix is not a prefix.
    bare = parse_lines("epoch 1\nepoch 2\n3: not a prefix\n")
    assert bare[2].rank is None
    pdsh = parse_lines(corpus("17"))
    assert any(ln.host for ln in pdsh) and not any(ln.text.startswith("202.197.") for ln in pdsh if ln.host)


def test_a_line_wrapped_mid_token_is_joined_and_read() -> None:
    """24: `OpTy` / `pe=BROADCAST` (the continuation carries no prefix)."""
    said = statements(parse_lines(corpus("24")))
    assert said.by_rank, said.notes
    for words in said.by_rank.values():
        t = nccl.timeout_of(words[0])
        assert t is not None and (t.op, t.seq, t.numel_in) == ("BROADCAST", 4, 112), words


def test_old_watchdog_lines_without_seq_or_prefix_are_read_for_the_default_group() -> None:
    """03 (torch < 1.10: no SeqNum, wrapped, no prefix) and 01 (no prefix)."""
    failures, _notes = read_log(next(LOGS.glob("03-*.log")))
    timeouts = [t for f in failures for ln in f.message.splitlines() if (t := nccl.timeout_of(ln))]
    assert timeouts and all(t.seq is None and t.op == "ALLREDUCE" for t in timeouts), failures
    failures, _notes = read_log(next(LOGS.glob("01-*.log")))
    assert len(failures) >= 2 and all("SeqNum=469508" in f.message for f in failures)


def test_ranks_of_a_subgroup_without_a_prefix_are_said_not_named() -> None:
    """Two groups' lines without `[rankN]:` prefixes: [Rank N] is a rank within its group."""
    text = ("[E ProcessGroupNCCL.cpp:1] [PG ID 2 PG GUID 2(TENSOR_MODEL_PARALLEL_GROUP) Rank 1] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=264, OpType=ALLREDUCE, NumelIn=2, "
            "NumelOut=2, Timeout(ms)=600000) ran for 600139 milliseconds before timing out.\n")
    said = statements(parse_lines(text))
    assert not said.by_rank and "process group 2" in said.notes[0] and "not named" in said.notes[0]


def test_elastic_agent_lines_alone_name_a_local_rank_on_one_node_and_say_so() -> None:
    failures, _notes = read_log(next(LOGS.glob("31-*.log")))
    assert [(f.rank, f.signal) for f in failures] == [(0, "SIGKILL")], failures
    several = ("group_rank=1\nnnodes=2\nERROR:torch.distributed.elastic.multiprocessing.api:failed "
               "(exitcode: 1) local_rank: 2 (pid: 5939) of binary: /usr/bin/python3\n")
    said = statements(parse_lines(several))
    assert said.local_exits == {2: (1, 5939)} and not said.local_is_global


def test_the_desync_report_keeps_its_lists_through_the_canonical_text() -> None:
    report = nccl.desync_of(" ".join(corpus("12").splitlines()[:12]))
    assert report is not None and report.joined_not_finished == tuple(range(16)), report
    again = nccl.desync_of(nccl.canonical_desync(report))
    assert again == report


def _ended(rank: int, reason: str, **kw: object) -> RankState:
    return RankState(rank=rank, local_rank=rank, world_size=kw.pop("world", 0), host="h",  # type: ignore[arg-type]
                     pid=10 + rank, time=NOW - 5, status="crashed", exit_reason=reason, exited_at=NOW - 5,
                     **kw)  # type: ignore[arg-type]


def _watchdog(rank: int, seq: int, op: str = "ALLREDUCE", numel: int = 6) -> str:
    # The line of 11-desync-report-rank7-lagging.log, with this rank and seq.
    line = next(ln for ln in corpus("11").splitlines() if "Watchdog caught" in ln)
    t = nccl.timeout_of(line)
    assert t is not None
    mine = t._replace(group_rank=rank, seq=seq, op=op, numel_in=numel, numel_out=numel)
    return nccl.canonical_timeout(mine)


def test_two_ranks_that_disagree_with_no_third_cannot_be_told_apart() -> None:
    """The issue's two lines: rank 0 at SeqNum=315, rank 1 at 313. Rank 0's own line shows it
    past 313: it is never "never reached 313"; with no third rank, both, "cannot be told"."""
    snap = build_snapshot("j", 0, [_ended(0, _watchdog(0, 315)), _ended(1, _watchdog(1, 313))], {}, NOW)
    (f,) = watchdog_timeout(snap, {}, NOW, DiagnosisConfig())
    assert (f.ranks, f.certain) == ([0, 1], False) and "cannot be told" in f.title, f
    assert "never reached" not in f.title and any("what would tell" in e for e in f.evidence)
    three = [_ended(0, _watchdog(0, 315)), _ended(2, _watchdog(2, 315)), _ended(1, _watchdog(1, 313))]
    (g,) = watchdog_timeout(build_snapshot("j", 0, three, {}, NOW), {}, NOW, DiagnosisConfig())
    assert (g.ranks, g.certain, g.victims) == ([1], True, [0, 2]) and "fell behind" in g.title, g


def test_missing_ranks_are_said_never_guessed() -> None:
    """Ranks 0-1 timed out; the job's size is not in the evidence: no rank is named."""
    states = [_ended(0, _watchdog(0, 12)), _ended(1, _watchdog(1, 12))]
    (f,) = watchdog_timeout(build_snapshot("j", 0, states, {}, NOW), {}, NOW, DiagnosisConfig())
    assert (f.ranks, f.certain) == ([], False) and "the job's other ranks" in f.title, f
    # A rank of a known 4-rank job whose own record shows it short of #12 is named; one with
    # nothing known is said.
    last = PendingOp(seq=11, op="nccl:all_reduce")
    behind = RankState(rank=2, local_rank=2, world_size=4, host="h", pid=12, time=NOW - 5,
                       status="terminated", collectives=[CollectiveGroup(pg="0", seq=11, recent=[last])])
    states = [_ended(r, _watchdog(r, 12), world=4) for r in (0, 1)] + [behind]
    (g,) = watchdog_timeout(build_snapshot("j", 4, states, {}, NOW), {}, NOW, DiagnosisConfig())
    assert g.ranks == [2] and "rank 3" in " ".join(g.evidence) and "unknown" in " ".join(g.evidence), g


def test_alltoall_timeouts_of_different_sizes_are_one_collective() -> None:
    states = [_ended(r, _watchdog(r, 80, "ALLTOALL_BASE", 1000 + r), world=3) for r in range(3)]
    (f,) = watchdog_timeout(build_snapshot("j", 3, states, {}, NOW), {}, NOW, DiagnosisConfig())
    assert f.kind == "collective_stall" and f.ranks == [] and "every rank" in f.title, f


def test_the_fingerprint_check_names_the_minority_of_three_and_not_one_of_two() -> None:
    def fp(rank: int, other: int, mine: str, theirs: str) -> str:
        return nccl.canonical_fingerprint(nccl.Fingerprint(rank, mine, other, theirs))
    ar = "SequenceNumber=8, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float"
    bc = "SequenceNumber=8, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Float"
    two = [_ended(0, fp(0, 1, ar, bc)), _ended(1, fp(1, 0, bc, ar))]
    (f,) = fingerprint_mismatch(build_snapshot("j", 0, two, {}, NOW), {}, NOW, DiagnosisConfig())
    assert (f.ranks, f.certain) == ([0, 1], False), f
    three = [_ended(0, fp(0, 2, ar, bc)), _ended(1, fp(1, 2, ar, bc)), _ended(2, fp(2, 0, bc, ar))]
    (g,) = fingerprint_mismatch(build_snapshot("j", 0, three, {}, NOW), {}, NOW, DiagnosisConfig())
    assert (g.ranks, g.certain, g.victims) == ([2], True, [0, 1]), g
    a2a = [_ended(r, fp(r, (r + 1) % 3, f"SequenceNumber=3, OpType=ALLTOALL_BASE, TensorShape=[{r + 1}, 4]",
                        f"SequenceNumber=3, OpType=ALLTOALL_BASE, TensorShape=[{(r + 1) % 3 + 1}, 4]"))
           for r in range(3)]
    assert fingerprint_mismatch(build_snapshot("j", 0, a2a, {}, NOW), {}, NOW, DiagnosisConfig()) == []


def test_the_desync_report_leads_over_the_watchdog_lines() -> None:
    text = corpus("11")
    failures, _ = read_log(next(LOGS.glob("11-*.log")))
    states = [_ended(f.rank, f.message) for f in failures]
    snap = build_snapshot("j", 0, states, {}, NOW)
    assert watchdog_timeout(snap, {}, NOW, DiagnosisConfig()) == []
    (f,) = desync_report(snap, {}, NOW, DiagnosisConfig())
    assert f.ranks == [7] and "Timeout at collective" in text
