"""The digest's field classes (ddptop.digest) and the new wire structs, without sockets.

Every field of a rank's state is in exactly one class (a new field fails here until it is
placed); a pulse applied to the rank's last detail gives back the state on every pulse and
detail field; the on-demand fields change no finding; an older peer's copy of Hello and
Request reads the new ones (and the new ones read the old bytes).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from ddptop import digest
from ddptop.diagnosis import findings_for_model
from ddptop.model.job import JobModel
from ddptop.protocol import (
    COMMANDS,
    CollectiveGroup,
    GpuInfo,
    Hello,
    HistoryMsg,
    LoaderInfo,
    Message,
    NodeDigest,
    NodeSummary,
    PendingOp,
    RankState,
    RecordEntry,
    ReporterStats,
    Request,
    Sample,
    StateMsg,
    Versions,
)
from ddptop.wire import FrameBuffer, encode_frame, header_bytes

NOW = 1_700_000_000.0
CLASSES = {"pulse": digest.PULSE_FIELDS, "detail": digest.DETAIL_FIELDS, "on demand": digest.ON_DEMAND_FIELDS}


def leaves(struct: type, prefix: str = "") -> set[str]:
    """Every field path of *struct*, containers opened into their parts."""
    out: set[str] = set()
    for f in msgspec.structs.fields(struct):
        path = prefix + f.name
        inner = digest.CONTAINERS.get(path) or digest.CONTAINERS.get(path + "[]")
        if inner is None:
            out.add(path)
        else:
            out |= leaves(inner, (path if path in digest.CONTAINERS else path + "[]") + ".")
    return out


def test_every_rank_state_field_is_in_exactly_one_class() -> None:
    fields = leaves(RankState)
    classified = {digest.leaf_of(p) for paths in CLASSES.values() for p in paths}
    assert fields - classified == set(), "fields in no class: place them in ddptop/digest.py"
    assert classified - fields == set(), "class entries that name no field"
    for (a, pa), (b, pb) in itertools.combinations(CLASSES.items(), 2):
        assert pa & pb == set(), f"in both {a} and {b}"


# ------------------------------------------------------------------ states, scrambled by class

small = st.integers(min_value=0, max_value=1 << 20)
floats = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)
opt = st.none
text = st.text(max_size=8)
milestones = st.lists(st.tuples(small, floats), unique_by=lambda e: e[0], max_size=5).map(sorted)
ops = st.builds(PendingOp, seq=small, op=text, dtype=text, age_s=floats, started_at=floats,
                timeout_s=opt() | floats, state=text, is_p2p=st.booleans(), p2p_seq=small, peer=opt() | small)


@st.composite
def groups(draw: st.DrawFn, pg: str) -> CollectiveGroup:
    return CollectiveGroup(pg=pg, seq=draw(small), desc=draw(text), size=draw(small), backend=draw(text),
                           timeout_s=draw(opt() | floats), pending=draw(st.lists(ops, max_size=2)),
                           seq_changed_at=draw(floats), enqueue_times=draw(milestones),
                           ranks=draw(st.lists(small, max_size=3)), last_completed=draw(opt() | small))


loaders = st.builds(LoaderInfo, index=small, name=text, role=text, length=opt() | small, batch=small,
                    passes=small, passes_completed=small, steps=small, batch_size=opt() | small,
                    workers=small, worker_pids=st.lists(small, max_size=2), ready_batches=opt() | small,
                    last_batch_at=floats, rebuilt=small)
gpus = st.builds(GpuInfo, index=small, uuid=text, name=text, driver=text, util_percent=opt() | floats,
                 mem_used_bytes=opt() | small, mem_total_bytes=opt() | small, temperature_c=opt() | floats,
                 power_w=opt() | floats)


@st.composite
def states(draw: st.DrawFn) -> RankState:
    pgs = draw(st.lists(st.sampled_from(["0", "1", "tp"]), unique=True, max_size=3))
    return RankState(
        rank=draw(small), local_rank=draw(small), world_size=draw(small), host=draw(text), pid=draw(small),
        status=draw(st.sampled_from(["running", "starting", "exited"])), time=draw(floats),
        step=draw(small), step_time_s=draw(opt() | floats), last_step_at=draw(floats), epoch=draw(small),
        batch=draw(small), batches_per_epoch=draw(opt() | small), data_wait_fraction=draw(opt() | floats),
        loader_ready_batches=draw(opt() | small), loader_worker_pids=draw(st.lists(small, max_size=2)),
        last_batch_at=draw(floats), collectives=[draw(groups(pg)) for pg in pgs],
        cpu_percent=draw(opt() | floats), rss_bytes=draw(opt() | small), threads=draw(opt() | small),
        load_avg=draw(st.lists(floats, max_size=3)), mem_available_bytes=draw(opt() | small),
        shm_used_bytes=draw(opt() | small), gpu=draw(opt() | gpus),
        env=draw(st.dictionaries(text, text, max_size=2)), loaders=draw(st.lists(loaders, max_size=2)),
        reporter=ReporterStats(errors=draw(small)),
    )


def scrambled(s: RankState, rng: random.Random, paths: frozenset[str]) -> RankState:
    """*s* with every field named in *paths* set to other values of its type (the shapes the
    detail key holds are kept: as many groups, ops, loaders and load averages)."""
    num = lambda v: None if rng.random() < 0.3 else rng.randint(0, 1 << 30)  # noqa: E731
    flo = lambda v: rng.uniform(-1e6, 1e6)  # noqa: E731
    other: dict[str, Any] = {
        "time": flo, "step": num, "epoch": num, "batch": num, "step_time_s": flo, "data_wait_fraction": flo,
        "loader_ready_batches": num, "cpu_percent": flo, "rss_bytes": num, "shm_used_bytes": num,
        "last_step_at": flo, "threads": num, "mem_available_bytes": num, "last_batch_at": flo,
        "loader_worker_pids": lambda v: [rng.randint(1, 99)], "env": lambda v: {"X": str(rng.random())},
        "reporter": lambda v: ReporterStats(errors=rng.randint(1, 9), last_error="boom"),
    }
    top = {p: other[p](getattr(s, p)) for p in paths if p in other}
    load = list(s.load_avg)
    if load and "load_avg[0]" in paths:
        load[0] = flo(0)
    if "load_avg[1:]" in paths:
        load[1:] = [flo(0) for _ in load[1:]]
    gpu = s.gpu
    if gpu is not None:
        gpu = replace(gpu, **{p[4:]: (text_of(rng) if p[4:] in ("uuid", "driver") else flo(0))
                              for p in paths if p.startswith("gpu.")})
    groups_ = []
    for g in s.collectives:
        kw: dict[str, Any] = {}
        if "collectives[].seq" in paths:
            kw["seq"] = rng.randint(0, 1 << 20)
        if "collectives[].seq_changed_at" in paths:
            kw["seq_changed_at"] = flo(0)
        if "collectives[].pending[].age_s" in paths:
            kw["pending"] = [replace(op, age_s=flo(0)) for op in g.pending]
        which = "pg=0" if g.pg == digest.DEFAULT_PG else "pg!=0"
        if f"collectives[{which}].enqueue_times" in paths:
            kw["enqueue_times"] = [(rng.randint(0, 99), flo(0))]
        groups_.append(replace(g, **kw))
    loaders_ = [replace(i, **{p[10:]: (rng.randint(1, 99) if p[10:] not in ("worker_pids", "last_batch_at")
                                       else ([7] if p[10:] == "worker_pids" else flo(0)))
                              for p in paths if p.startswith("loaders[].")}) for i in s.loaders]
    return replace(s, **top, load_avg=load, gpu=gpu, collectives=groups_, loaders=loaders_)


def text_of(rng: random.Random) -> str:
    return f"x{rng.randint(0, 999)}"


def without_on_demand(s: RankState) -> RankState:
    """*s* with every on-demand field set to one fixed value: what equality on P+D compares."""
    return scrambled(s, random.Random(0), digest.ON_DEMAND_FIELDS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=states(), seed=st.integers(0, 1 << 30), known=st.integers(0, 5), older=milestones)
def test_a_pulse_on_the_last_detail_gives_the_state_back(s: RankState, seed: int, known: int,
                                                         older: list[tuple[int, float]]) -> None:
    rng = random.Random(seed)
    base = scrambled(s, rng, digest.PULSE_FIELDS | digest.ON_DEMAND_FIELDS)
    # The viewer's copy of the default group's milestones: older ones, then some of the state's.
    g0 = next((g for g in s.collectives if g.pg == digest.DEFAULT_PG), None)
    if g0 is not None:
        first = g0.enqueue_times[0][0] if g0.enqueue_times else 1 << 21
        seen = [e for e in older if e[0] < first] + g0.enqueue_times[:known]
        base = replace(base, collectives=[replace(g, enqueue_times=seen) if g.pg == digest.DEFAULT_PG else g
                                          for g in base.collectives])
    assert digest.detail_key(base) == digest.detail_key(s)
    pulse = digest.pulse_of(s, 0.25, digest.last_enqueue_seq(base))
    pulse = msgspec.msgpack.decode(msgspec.msgpack.encode(pulse), type=type(pulse))  # as it travels
    got = digest.merged(base, pulse)
    assert without_on_demand(got) == without_on_demand(s)
    assert digest.detail_key(got) == digest.detail_key(s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=states(), seed=st.integers(0, 1 << 30))
def test_only_detail_fields_move_the_detail_key(s: RankState, seed: int) -> None:
    rng = random.Random(seed)
    assert digest.detail_key(scrambled(s, rng, digest.PULSE_FIELDS | digest.ON_DEMAND_FIELDS)) == \
        digest.detail_key(s)


@pytest.mark.parametrize("change", [
    {"status": "exited"}, {"pid": 2}, {"restart_count": 1}, {"batches_per_epoch": 9}, {"exit_reason": "boom"},
    {"versions": Versions(torch="other")}, {"gpu": None}, {"load_avg": []},
    {"collectives": []}, {"loaders": []},
])
def test_a_detail_change_moves_the_key(change: dict[str, Any]) -> None:
    s = scenario()[3]
    assert digest.detail_key(replace(s, **change)) != digest.detail_key(s)


@pytest.mark.parametrize("change", [
    {"seq": 1}, {"pending": []}, {"ranks": [0, 1]}, {"recent": [PendingOp(seq=1, op="x")]},
    {"last_completed": 7},
])
def test_a_group_change_moves_the_key(change: dict[str, Any]) -> None:
    s = scenario()[0]  # waits in all_reduce #3001
    group = replace(s.collectives[0], **change)
    moved = digest.detail_key(replace(s, collectives=[group, *s.collectives[1:]])) != digest.detail_key(s)
    assert moved == ("seq" not in change)  # the seq is a pulse: it moves every step


# ------------------------------------------------------------------ the rules never read on-demand fields


def scenario() -> list[RankState]:
    """Four ranks: three wait in all_reduce #3001, the fourth never entered it; loader
    lengths differ; every field filled, on-demand ones included."""
    out = []
    for r in range(4):
        waiting = PendingOp(seq=3001, op="gloo:all_reduce", age_s=12.0, started_at=NOW - 12,
                            sizes=[[[1000]], [[1000]]])
        pending = [] if r == 3 else [waiting]
        group = CollectiveGroup(pg="0", seq=3000 if r == 3 else 3001, size=4, backend="gloo",
                                seq_changed_at=NOW - 12, pending=pending,
                                enqueue_times=[(2992, NOW - 13 + r)])
        side = CollectiveGroup(pg="1", seq=10, size=2, enqueue_times=[(8, NOW - 30)])
        out.append(RankState(
            rank=r, local_rank=r, world_size=4, host="node-0", pid=100 + r, job_id="j", time=NOW - 0.2,
            start_time=NOW - 600, step=500, step_time_s=0.2, last_step_at=NOW - 12, epoch=1, batch=100,
            batches_per_epoch=1250 if r else 1200, loader_workers=2, loader_worker_pids=[7, 8],
            last_batch_at=NOW - 12, backend="gloo", collectives=[group, side], cpu_percent=100.0,
            rss_bytes=1 << 30, threads=12, load_avg=[3.0, 2.0, 1.0], cpu_count=16,
            mem_available_bytes=1 << 33,
            shm_used_bytes=1 << 20, shm_total_bytes=1 << 33, env={"NCCL_DEBUG": "INFO"},
            gpu=GpuInfo(index=r, uuid="u", name="H100", driver="550", util_percent=99.0,
                        mem_used_bytes=1 << 34, mem_total_bytes=1 << 36, temperature_c=60.0, power_w=500.0),
            loaders=[LoaderInfo(index=0, name="DataLoader(T)", role="train", length=1250, batch=100, passes=1,
                                steps=500, batch_size=32, workers=2, worker_pids=[7, 8], ready_batches=2,
                                last_batch_at=NOW - 12)],
        ))
    return out


def findings(states_: list[RankState]) -> list[bytes]:
    model = JobModel(job_id="j", world_size=4)
    for s in states_:
        history = [Sample.of(replace(s, step=s.step - 20 + i), NOW - 20 + i) for i in range(20)]
        ring = HistoryMsg(rank=s.rank, samples=history)
        model.apply(RecordEntry(time=NOW - 0.1, rank=s.rank, message=ring))
        model.apply(RecordEntry(time=NOW - 0.1, rank=s.rank, message=StateMsg(state=s)))
    return [msgspec.json.encode(f) for f in findings_for_model(model, NOW)]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1 << 30))
def test_scrambled_on_demand_fields_change_no_finding(seed: int) -> None:
    rng = random.Random(seed)
    base = scenario()
    before = findings(base)
    assert before, "the scenario must give findings to compare"
    assert findings([scrambled(s, rng, digest.ON_DEMAND_FIELDS) for s in base]) == before


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mine=st.lists(states(), min_size=2, max_size=4), seed=st.integers(0, 1 << 30))
def test_random_states_findings_ignore_on_demand_fields(mine: list[RankState], seed: int) -> None:
    rng = random.Random(seed)
    mine = [replace(s, rank=r, world_size=len(mine), time=NOW - 1) for r, s in enumerate(mine)]
    assert findings([scrambled(s, rng, digest.ON_DEMAND_FIELDS) for s in mine]) == findings(mine)


# ------------------------------------------------------------------ the wire: old peers, new structs


class OldHello(msgspec.Struct, tag="hello", kw_only=True):
    """Hello as a peer of before the digest decodes it."""

    protocol: int
    role: str
    nonce: str = ""
    auth_required: bool = False
    rank: int | None = None
    job_id: str = ""


class OldRequest(msgspec.Struct, tag="request", kw_only=True):
    command: str
    id: int = 0


def test_older_peers_read_the_new_hello_and_request_and_the_new_read_theirs() -> None:
    hello = Hello(protocol=1, role="agent", rank=-1, job_id="j", features=["digest"])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(hello), type=OldHello) == OldHello(
        protocol=1, role="agent", rank=-1, job_id="j")
    request = Request(command="state", id=3, ranks=[5])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=OldRequest) == OldRequest(
        command="state", id=3)
    old = msgspec.msgpack.encode(OldHello(protocol=1, role="agent", rank=-1))
    assert msgspec.msgpack.decode(old, type=Hello).features == []
    old = msgspec.msgpack.encode(OldRequest(command="history"))
    assert msgspec.msgpack.decode(old, type=Request).ranks == []
    assert "digest" in COMMANDS


def test_a_node_digest_travels_as_a_frame() -> None:
    states_ = scenario()
    pulses = [digest.pulse_of(s, 0.1, detail_no=1) for s in states_]
    sent = NodeDigest(time=NOW, no=7, summary=NodeSummary(host="node-0", ranks=[0, 1, 2, 3], silent=[3],
                                                          status_counts={"running": 4}),
                      details=[states_[3]], detail_nos=[1], pulses=pulses)
    got: list[Message] = FrameBuffer().feed(header_bytes() + encode_frame(sent))
    assert got == [sent]
    # what the lane is for: a pulse is a small part of the state frame it stands for
    entry = encode_frame(RecordEntry(time=NOW, rank=0, message=StateMsg(state=states_[0])))
    assert len(msgspec.msgpack.encode(pulses[0])) * 4 < len(entry)
