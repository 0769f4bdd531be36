"""The wavefront rule on its own: exact culprit sets, across groups, at scale.

Ranks are given as the normalised records the dump reader produces (``RankDump``), folded
by ``evidence.fold`` as ``ddptop doctor DUMPS`` folds them: these tests check the rule's
logic on shapes the real probes cannot make on one CPU machine (NCCL's started/completed
states, p2p between pipeline stages, 16 and 1024 ranks). The file formats themselves are
tested on real dumps (tests/test_evidence_*.py).
"""

from __future__ import annotations

from ddptop.bundle.reader import build_model, end_time
from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.finding import Finding
from ddptop.evidence.fold import fold_evidence
from ddptop.evidence.types import FrGroup, FrOp, FrProgress, RankDump

T0 = 1_795_000_000.0
OpSpec = tuple[
    str, int, str, str
]  # (group, seq, op, state); op "send>5" / "recv<5" is p2p with a global peer


def dump(rank: int, groups: dict[str, list[int]], ops: list[OpSpec], nccl: bool = True) -> RankDump:
    entries = []
    for i, (pg, seq, op, state) in enumerate(ops):
        p2p = op.startswith(("send", "recv"))
        peer_global = int(op[5:]) if p2p else None
        local_peer = groups[pg].index(peer_global) if peer_global is not None else None
        name = (
            f"nccl:{op[:4]} {groups[pg].index(rank)}{'->' if op[4] == '>' else '<-'}{local_peer}"
            if p2p
            else f"{'nccl' if nccl else 'gloo'}:{op}"
        )
        entries.append(
            FrOp(
                record_id=i,
                pg_name=pg,
                collective_seq=0 if p2p else seq,
                p2p_seq=seq if p2p else 0,
                op=name,
                is_p2p=p2p,
                peer=local_peer,
                input_sizes=[[8]],
                output_sizes=[[8]],
                input_dtypes=["Float"],
                state=state,
                retired=state == "completed",
                time_created=T0 + i,
            )
        )
    done = {
        pg: max(
            [o[1] for o in ops if o[0] == pg and o[3] == "completed" and o[2][:4] not in ("send", "recv")],
            default=0,
        )
        for pg in groups
    }
    return RankDump(
        path=f"/d/rank_{rank}",
        rank=rank,
        format="pickle",
        backend="nccl" if nccl else "gloo",
        groups={pg: FrGroup(name=pg, ranks=members) for pg, members in groups.items()},
        progress={pg: FrProgress(last_completed=done[pg]) for pg in groups},
        entries=entries,
        dump_time=T0 + 100,
    )


def diagnose(dumps: list[RankDump], world: int = 0) -> list[Finding]:
    contents = fold_evidence(dumps, [], job_id="t", path="/d", world_size=world)
    return findings_for_model(build_model(contents), end_time(contents))


def named(findings: list[Finding]) -> set[int]:
    return {r for f in findings if f.severity != "info" for r in f.ranks}


def allreduces(pg: str, upto: int, pending: bool = True) -> list[OpSpec]:
    return [
        (pg, s, "all_reduce", "completed" if s < upto or not pending else "started")
        for s in range(1, upto + 1)
    ]


def test_only_the_rank_that_never_entered_is_named_among_many_healthy() -> None:
    world = list(range(64))
    dumps = [dump(r, {"0": world}, allreduces("0", 40 if r == 37 else 41, pending=r != 37)) for r in world]
    found = diagnose(dumps)
    assert named(found) == {37}
    # The same words as live: the waiters, their op and age, then the sink's state (one story).
    assert found[0].title.endswith("in nccl:all_reduce #41; rank 37 never entered it"), found[0].title
    edge = "ranks 0-36,38-63 wait in all_reduce [8] float32 #41 for rank 37"
    assert any(e.startswith(edge) for e in found[0].evidence), found[0].evidence


def test_a_rank_without_a_dump_is_named_only_when_nothing_surer_is() -> None:
    world = list(range(8))
    dumps = [dump(r, {"0": world}, allreduces("0", 9)) for r in world if r != 5]
    assert named(diagnose(dumps)) == {5}
    # Rank 2 stopped at #8 and rank 5 left no dump: rank 2 is certain, rank 5 unknown.
    dumps = [
        dump(r, {"0": world}, allreduces("0", 8 if r == 2 else 9, pending=r != 2)) for r in world if r != 5
    ]
    found = diagnose(dumps)
    assert named(found) == {2} and any("rank 5 left no dump" in e for e in found[0].evidence)


def test_a_completion_not_yet_recorded_does_not_hide_the_culprit() -> None:
    """gloo retires from its own threads: the culprit's last op may still show as pending."""
    world = list(range(4))
    dumps = [dump(r, {"0": world}, allreduces("0", 5)) for r in (0, 2, 3)]
    dumps.append(dump(1, {"0": world}, allreduces("0", 4)))  # its #4 is done by all, but shows "started"
    assert named(diagnose(dumps)) == {1}


def test_megatron_style_chain_through_tensor_and_pipeline_groups() -> None:
    """16 ranks, TP=4 x PP=2 x DP=2. A TP all-reduce of stage 1 waits on rank 5, which waits in a
    pipeline recv from rank 1; rank 1 (stage 0) stopped before its send: rank 1 is the culprit."""
    tp = {f"tp{i}": list(range(4 * i, 4 * i + 4)) for i in range(4)}
    pp = {f"pp{j}": [j, j + 4] for j in range(4)} | {f"pp{j + 4}": [j + 8, j + 12] for j in range(4)}
    dp = {"dp0": list(range(16))}
    dumps = []
    for r in range(16):
        groups = {name: m for name, m in (tp | pp | dp).items() if r in m}
        mytp = next(n for n, m in tp.items() if r in m)
        mypp = next(n for n, m in pp.items() if r in m)
        ops: list[OpSpec] = [*allreduces("dp0", 3, pending=False), *allreduces(mytp, 7, pending=False)]
        stage = 0 if r % 8 < 4 else 1
        peer = pp[mypp][1 - stage]
        if r == 1:
            pass  # stage 0 rank 1: stopped before its send (a data-loading stall, an exception caught)
        elif stage == 0:
            ops.append((mypp, 1, f"send>{peer}", "completed"))
            ops.append((mytp, 8, "all_reduce", "started"))  # waits for rank 1 in its TP group
        elif r == 5:
            ops.append((mypp, 1, f"recv<{peer}", "started"))  # waits for rank 1's send
        else:
            ops.append((mypp, 1, f"recv<{peer}", "completed"))
            ops.append((mytp, 8, "all_reduce", "started"))  # stage 1 TP waits for rank 5
        dumps.append(dump(r, groups, ops))
    found = diagnose(dumps)
    assert named(found) == {1}, [f.title for f in found]
    text = " ".join(e for f in found for e in f.evidence)
    assert "rank 5 waits in recv" in text


def test_different_op_at_one_seq_names_the_minority_and_says_a_tie() -> None:
    world = list(range(6))
    dumps = [
        dump(
            r,
            {"0": world},
            [
                *allreduces("0", 3, pending=False),
                ("0", 4, "all_gather" if r == 4 else "all_reduce", "started"),
            ],
        )
        for r in world
    ]
    found = diagnose(dumps)
    assert named(found) == {4} and found[0].kind == "collective_mismatch"
    assert "all_gather [8] float32" in found[0].title
    tie = [dump(r, {"0": [0, 1]}, [("0", 1, "all_gather" if r else "all_reduce", "started")]) for r in (0, 1)]
    assert "cannot be told" in diagnose(tie)[0].title


def test_gloo_shape_subgroup_whose_members_the_dumps_cannot_show() -> None:
    """gloo: members inferred from the dumps; rank 0 waits in a group only it shows; rank 1 is idle."""
    world = list(range(4))
    dumps = [
        dump(
            0,
            {"0": world, "1": [0]},
            [*allreduces("0", 2, pending=False), ("1", 1, "all_reduce", "scheduled")],
            nccl=False,
        ),
        dump(1, {"0": world}, allreduces("0", 2, pending=False), nccl=False),
        *(dump(r, {"0": world}, allreduces("0", 3), nccl=False) for r in (2, 3)),
    ]
    assert named(diagnose(dumps)) == {1}
