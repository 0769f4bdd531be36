"""The op table (#33 item 1): a size difference is a mismatch only where the op demands equality.

Sizes and op names are those torch's Flight Recorder writes (``gloo:all_to_all`` with each
rank's split sizes, as tests/data/fr_moe's real dumps hold them). Every rule that compares
ranks' ops is run on uneven all_to_all and must name no rank; the same ranks in an
all_reduce of different sizes must be named.
"""

from __future__ import annotations

import pytest

from ddptop.diagnosis import DiagnosisConfig, diagnose
from ddptop.diagnosis.op_semantics import base_name, is_p2p, signature, sizes_differ_allowed
from ddptop.diagnosis.rules_collectives import collective_mismatch
from ddptop.diagnosis.rules_divergence import collective_divergence
from ddptop.diagnosis.rules_wavefront import collective_wavefront
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankState

NOW = 1_000_000.0
# Rank r's input and output of collective #2 of an ep group in tests/data/fr_moe/stop_ep (real).
A2A = {0: ([[9, 4]], [[9, 4]]), 1: ([[7, 4]], [[12, 4]]), 2: ([[10, 4]], [[11, 4]]), 3: ([[12, 4]], [[6, 4]])}


def op(name: str, inputs: list[list[int]], outputs: list[list[int]], seq: int = 2,
       dtype: str = "Float") -> PendingOp:
    return PendingOp(seq=seq, op=name, sizes=[inputs, outputs], dtype=dtype, age_s=60.0, started_at=NOW - 60,
                     state="started")


def test_names_and_rules_of_the_table() -> None:
    assert base_name("nccl:send 0->1") == "send" and base_name("gloo:all_to_all") == "all_to_all"
    assert base_name("ALLREDUCE") == "all_reduce" and base_name("_ALLGATHER_BASE") == "_allgather_base"
    for name in ("gloo:all_to_all", "nccl:all_to_all", "ALLTOALL_BASE", "gather", "scatter", "all_gather",
                 "reduce_scatter", "nccl:coalesced", "barrier"):
        assert sizes_differ_allowed(name), name
    for name in ("gloo:all_reduce", "nccl:broadcast", "nccl:reduce", "nccl:_allgather_base",
                 "nccl:reduce_scatter_tensor_coalesced", "some_new_op"):
        assert not sizes_differ_allowed(name), name  # unknown ops keep the strict rule
    assert is_p2p(PendingOp(seq=1, op="nccl:recv 1<-0"))
    assert not is_p2p(PendingOp(seq=1, op="nccl:all_reduce"))


@pytest.mark.parametrize(("name", "a", "b", "same"), [
    ("gloo:all_to_all", A2A[0], A2A[1], True),  # uneven splits
    ("gloo:all_reduce", ([[16]], [[16]]), ([[32]], [[32]]), False),
    ("nccl:broadcast", ([[4]], [[4]]), ([[8]], [[8]]), False),
    ("nccl:gather", ([[4]], [[4], [4]]), ([[4]], []), True),  # the output list on the root only
    ("nccl:gather", ([[4]], [[4], [4]]), ([[5]], []), False),  # inputs must agree
    ("nccl:scatter", ([[4], [4]], [[4]]), ([], [[4]]), True),
    ("nccl:all_gather", ([[3]], [[3], [5]]), ([[5]], [[3], [5]]), True),  # uneven list: inputs differ
    ("nccl:all_gather", ([[3]], [[3], [5]]), ([[3]], [[3], [3]]), False),
    ("nccl:_allgather_base", ([[4]], [[8]]), ([[2]], [[4]]), False),
])
def test_signature_compares_only_what_the_op_demands(name: str, a: tuple[list[list[int]], list[list[int]]],
                                                     b: tuple[list[list[int]], list[list[int]]],
                                                     same: bool) -> None:
    assert (signature(op(name, *a)) == signature(op(name, *b))) is same


def test_dtype_differs_is_a_mismatch_even_for_all_to_all() -> None:
    half = op("gloo:all_to_all", *A2A[0], dtype="Half")
    assert signature(op("gloo:all_to_all", *A2A[0])) != signature(half)


Sizes = dict[int, tuple[list[list[int]], list[list[int]]]]


def _live(name: str, sizes: Sizes, pg_ranks: bool) -> list[RankState]:
    def group(r: int) -> CollectiveGroup:
        return CollectiveGroup(pg="5", seq=2, desc="ep", size=4, ranks=[0, 1, 2, 3] if pg_ranks else [],
                               # live states carry no recent ops (last words and dumps do)
                               pending=[op(name, *sizes[r])],
                               recent=[op(name, *sizes[r])] if pg_ranks else [],
                               seq_changed_at=NOW - 60)
    return [RankState(rank=r, local_rank=r, world_size=4, host="h", pid=10 + r, time=NOW - 1,
                      status="running", collectives=[group(r)]) for r in range(4)]


@pytest.mark.parametrize("pg_ranks", [False, True], ids=["live pending ops", "dumped groups (wavefront)"])
def test_uneven_all_to_all_names_no_rank_and_all_reduce_of_other_sizes_does(pg_ranks: bool) -> None:
    config = DiagnosisConfig()
    even = {r: ([[16]], [[16]]) for r in range(4)}
    odd = {**even, 3: ([[32]], [[32]])}
    for name, sizes, named in (("gloo:all_to_all", A2A, []), ("gloo:all_reduce", odd, [3])):
        snap = build_snapshot("j", 4, _live(name, sizes, pg_ranks), {}, NOW)
        rule = collective_wavefront if pg_ranks else collective_mismatch
        found = [f for f in rule(snap, {}, NOW, config) if f.kind == "collective_mismatch"]
        assert [f.ranks for f in found] == ([named] if named else []), [f.title for f in found]
        every = [f for f in diagnose(snap, {}, NOW, config) if f.kind == "collective_mismatch"]
        assert all(f.ranks == named for f in every), [f.title for f in every]


def test_after_the_job_died_uneven_all_to_all_is_no_divergence() -> None:
    ended = [RankState(rank=r, local_rank=r, world_size=4, host="h", pid=10 + r, time=NOW - 1,
                       status="crashed", exit_reason="terminated", exited_at=NOW - 1,
                       collectives=[CollectiveGroup(pg="5", seq=2, recent=[op("gloo:all_to_all", *A2A[r])])])
             for r in range(4)]
    assert collective_divergence(build_snapshot("j", 4, ended, {}, NOW), {}, NOW, DiagnosisConfig()) == []


def test_the_tables_mismatch_mark_compares_a_seq_within_its_group_only() -> None:
    """Live MoE ranks: rank 0 waits in tp all_reduce #5 (group 1), rank 1 in ep all_to_all #5
    (group 5): the same number in two groups is two collectives, no MISMATCH; two ranks in
    one group at #5 with different ops are."""
    from ddptop.diagnosis.desync import MISMATCH, facts_of, leads_of, marks_of

    def rank(r: int, pg: str, name: str) -> RankState:
        pending = op(name, [[16]], [[16]], seq=5)
        return RankState(rank=r, local_rank=r, world_size=4, host="h", pid=r, time=NOW, status="running",
                         collectives=[CollectiveGroup(pg=pg, seq=5, pending=[pending])])

    def marks(states: list[RankState]) -> list[list[str]]:
        facts = [facts_of(s, "running") for s in states]
        leads = leads_of(facts)
        return [marks_of(f, leads) for f in facts]

    two_groups = [rank(0, "1", "gloo:all_reduce"), rank(1, "5", "gloo:all_to_all"),
                  rank(2, "1", "gloo:all_reduce"), rank(3, "5", "gloo:all_to_all")]
    assert not any(MISMATCH in m for m in marks(two_groups))
    one_group = [rank(0, "1", "gloo:all_reduce"), rank(1, "1", "gloo:all_reduce"),
                 rank(2, "1", "gloo:all_gather")]
    assert [MISMATCH in m for m in marks(one_group)] == [False, False, True]
