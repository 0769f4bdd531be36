"""The wait-for graph on its own (#45): edges, sinks, victims and cycles from ranks' states.

States are built as the live reporter sends them (groups with members, FR's collective
counter while a group stands still, pending collectives and point-to-point ops); the real
jobs are in tests/test_wait_chains_e2e.py and tests/test_moe_dumps_e2e.py.
"""

from __future__ import annotations

from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.engine import diagnose
from ddptop.diagnosis.wait_graph import build
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankState

NOW = 1_000_000.0
CONFIG = DiagnosisConfig()


def rank(r: int, groups: list[CollectiveGroup], world: int = 4, status: str = "running") -> RankState:
    return RankState(rank=r, local_rank=r, world_size=world, host="h", pid=100 + r, time=NOW - 0.5,
                     start_time=NOW - 600, status=status, collectives=groups)


def group(pg: str, members: list[int], entered: int, pending: list[PendingOp] | None = None,
          desc: str = "") -> CollectiveGroup:
    """A group standing still: FR's counters sent, as the reporter does once it stood 2 s."""
    done = entered - 1 if pending and not pending[0].is_p2p else entered
    return CollectiveGroup(pg=pg, seq=entered, desc=desc, size=len(members),
                           ranks=members if pg != "0" else [], enqueued=entered, last_completed=done,
                           pending=pending or [], seq_changed_at=NOW - 30)


def waiting(seq: int, op: str = "gloo:all_reduce", age: float = 20.0) -> list[PendingOp]:
    return [PendingOp(seq=seq, op=op, age_s=age, started_at=NOW - age)]


def p2p(direction: str, peer: int, seq: int = 0, age: float = 20.0) -> list[PendingOp]:
    return [PendingOp(seq=seq, op=f"gloo:{direction}", age_s=age, started_at=NOW - age, is_p2p=True,
                      peer=peer)]


def hsdp() -> list[RankState]:
    """2x2 mesh: replicate {0,2} {1,3}, shard {0,1} {2,3}; rank 3 sleeps in backward."""
    rep, shard = "mesh_replicate", "mesh_shard"
    return [
        rank(0, [group("1", [0, 2], 13, waiting(13), rep), group("3", [0, 1], 41, None, shard)]),
        rank(1, [group("2", [1, 3], 13, waiting(13), rep), group("3", [0, 1], 41, None, shard)]),
        rank(2, [group("1", [0, 2], 12, None, rep), group("4", [2, 3], 41, waiting(41), shard)]),
        rank(3, [group("2", [1, 3], 12, None, rep), group("4", [2, 3], 40, None, shard)]),
    ]


def test_hsdp_every_wait_ends_at_the_stalled_rank() -> None:
    graph = build(build_snapshot("j", 4, hsdp(), {}, NOW), NOW, CONFIG)
    assert {r: sorted(w.waits_for) for r, w in graph.waits.items()} == {0: [2], 1: [3], 2: [3]}
    assert graph.sinks() == {3} and graph.victims_of({3}) == {0, 1, 2} and not graph.cycles
    found = diagnose(build_snapshot("j", 4, hsdp(), {}, NOW), {}, NOW)
    (f,) = [f for f in found if f.kind == "collective_stall"]
    assert (f.ranks, f.victims) == ([3], [0, 1, 2])
    assert "their waits across groups end at rank 3" in f.title, f.title
    assert [(e.ranks, e.waits_for) for e in f.waits] == [([0], [2]), ([1], [3]), ([2], [3])]
    assert f.waits[2].op == "gloo:all_reduce #41 of group 4 mesh_shard (ranks 2-3)"


def test_pipeline_recv_waits_for_its_source_never_for_the_whole_group() -> None:
    """Gloo's seq counts sends and recvs: the stages' seqs differ by design, and FR shows no
    collective pending; the recv/send edges alone end at the stuck stage."""
    world = list(range(4))
    states = [rank(0, [group("0", world, 14, p2p("recv", 1))]),
              rank(1, [group("0", world, 26, p2p("send", 2))]),
              rank(2, [group("0", world, 24)]),
              rank(3, [group("0", world, 13, p2p("recv", 2))])]
    found = [f for f in diagnose(build_snapshot("j", 4, states, {}, NOW), {}, NOW) if f.at_least("warning")]
    assert [(f.kind, f.ranks, f.victims) for f in found] == [("collective_stall", [2], [0, 1, 3])], found
    assert "rank 2 never posted the recv that rank 1 waits for" in found[0].title, found[0].title
    assert "#" not in found[0].title.split(":", 1)[1]


def test_two_groups_called_in_opposite_orders_are_a_deadlock() -> None:
    states = [rank(0, [group("1", [0, 1], 7, waiting(7)), group("2", [0, 1], 6)], world=2),
              rank(1, [group("1", [0, 1], 6), group("2", [0, 1], 7, waiting(7))], world=2)]
    graph = build(build_snapshot("j", 2, states, {}, NOW), NOW, CONFIG)
    assert graph.cycles == [[0, 1]] and graph.sinks() == set()
    found = diagnose(build_snapshot("j", 2, states, {}, NOW), {}, NOW)
    assert [(f.kind, f.ranks) for f in found if f.at_least("warning")] == [("collective_deadlock", [0, 1])]


def test_a_rank_that_ended_while_blocked_still_waits_one_that_ended_outside_is_waited_for() -> None:
    """A watchdog's abort ends every waiting rank: their last ops still say whom they waited for;
    the rank that crashed on its own, outside any op, is the end of the waits."""
    world = list(range(4))
    states = [rank(r, [group("0", world, 9, waiting(9))], status="crashed") for r in (0, 1, 3)]
    states.append(rank(2, [group("0", world, 9)], status="crashed"))  # entered #9's count, then died
    graph = build(build_snapshot("j", 4, states, {}, NOW), NOW, CONFIG)
    assert graph.sinks() == {2} and graph.victims_of({2}) == {0, 1, 3}


def test_a_rank_never_waits_for_itself_when_its_count_lags_its_pending_op() -> None:
    """A sample whose group count was read before the op was posted (seq 40, pending #41):
    the rank has entered #41 all the same; it waits for its peer, never for itself (a cycle of
    one, told as a deadlock, was found by tests/test_digest.py's random states)."""
    lagging = CollectiveGroup(pg="3", seq=40, size=2, ranks=[0, 1], pending=waiting(41),
                              seq_changed_at=NOW - 30)
    states = [rank(0, [lagging], world=2), rank(1, [group("3", [0, 1], 40)], world=2)]
    graph = build(build_snapshot("j", 2, states, {}, NOW), NOW, CONFIG)
    assert {r: sorted(w.waits_for) for r, w in graph.waits.items()} == {0: [1]} and not graph.cycles
    alone = [rank(0, [CollectiveGroup(pg="tp", seq=5, size=1, ranks=[0], pending=waiting(9))], world=1)]
    graph = build(build_snapshot("j", 1, alone, {}, NOW), NOW, CONFIG)
    assert not graph.cycles and not any(w.waits_for for w in graph.waits.values())


def test_a_long_pipeline_is_followed_without_recursion() -> None:
    """8,192 stages (eight times Python's recursion limit), each waiting in recv for the one
    before; stage 0 is stuck."""
    n = 8_192
    states = [rank(0, [group("0", [], 1)], world=n)]
    states += [rank(r, [group("0", [], 1, p2p("recv", r - 1))], world=n) for r in range(1, n)]
    graph = build(build_snapshot("j", n, states, {}, NOW), NOW, CONFIG)
    assert graph.sinks() == {0} and len(graph.victims_of({0})) == n - 1


def test_recorded_job_reads_the_same_as_live() -> None:
    """The same states, folded into a model as a recording replays them: the same finding."""
    from ddptop.model.job import JobModel
    from ddptop.protocol import RecordEntry, StateMsg

    model = JobModel("j", 4)
    for s in hsdp():
        model.apply(RecordEntry(time=s.time, rank=s.rank, message=StateMsg(state=s)))
    found = [f for f in findings_for_model(model, NOW) if f.kind == "collective_stall"]
    assert [(f.ranks, f.victims) for f in found] == [([3], [0, 1, 2])]
