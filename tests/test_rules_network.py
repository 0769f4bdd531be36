"""host_unreachable, pure: a cut-off host named with its ranks and since when, from either side.

The snapshots are what a viewer folds (ddptop.model.job), built here as the live view and a
doctor's merge of its node agent's record give them: ``job.unreachable_since`` and
``job.unreachable`` for the ranks whose node agent went silent, ``job.nodes`` and
``job.addresses`` from the job's store. (Over real sockets: tests/test_reachability.py; a cut
cable between three hosts: tests/test_three_hosts.py.)
"""

from __future__ import annotations

import time

import msgspec

from ddptop.diagnosis import diagnose
from ddptop.model.job import JobModel
from ddptop.model.rank_view import UNREACHABLE
from ddptop.model.snapshot import JobSnapshot, build_snapshot
from ddptop.protocol import ConnectionEvent, RankState, StateMsg
from tests.test_diagnosis_rules import NOW, at_seq, in_collective

CUT = NOW - 20.0  # host-c last heard from 20 s ago
WHY = "node agent of host-c at 192.0.2.3:4000: no beat for 8 s, its connection open"
PLACES = {r: (f"host-{'abc'[r // 2]}", f"192.0.2.{r // 2 + 1}") for r in range(6)}


def hosted(state: RankState) -> RankState:
    return msgspec.structs.replace(state, host=PLACES[state.rank][0], world_size=6)


def from_a() -> JobSnapshot:
    """Host a's view: ranks 0-3 wait in all_reduce #37, ranks 4-5 last seen before it."""
    waiting = [hosted(in_collective(r, 37, world=6)) for r in range(4)]
    behind = [hosted(msgspec.structs.replace(at_seq(r, 36, world=6), time=CUT)) for r in (4, 5)]
    return build_snapshot("j", 6, waiting + behind, {4: WHY, 5: WHY}, NOW, PLACES, {4: CUT, 5: CUT})


def test_the_host_behind_a_cut_cable_is_named_with_its_ranks_and_since_when() -> None:
    found = diagnose(from_a(), {}, NOW)
    lead = found[0]
    assert lead.kind == "host_unreachable" and lead.severity == "critical", found
    clock = time.strftime("%H:%M:%S", time.localtime(CUT))
    assert lead.title == f"host host-c (192.0.2.3) unreachable since {clock}: ranks 4-5"
    assert (lead.ranks, lead.since, lead.certain) == ([4, 5], CUT, True)
    assert lead.evidence[0] == WHY
    assert "last heard from 20.0s ago, at 192.0.2.3" in lead.evidence
    assert "ranks 0-3 wait in gloo:all_reduce #37: they cannot finish without ranks 4-5" in lead.evidence
    # The stall it causes agrees with it (the same ranks): one story, the partition first.
    stall = next(f for f in found if f.kind == "collective_stall")
    assert set(stall.ranks) == {4, 5} and stall.severity != "info"


def test_the_host_that_was_cut_off_says_it_lost_every_other_host() -> None:
    own = [hosted(in_collective(r, 37, world=6)) for r in (4, 5)]  # never heard 0-3 at all
    since = {r: CUT for r in range(4)}
    snap = build_snapshot("j", 6, own, {r: WHY for r in range(4)}, NOW, PLACES, since)
    lead = diagnose(snap, {}, NOW)[0]
    assert lead.kind == "host_unreachable" and lead.ranks == [0, 1, 2, 3]
    assert lead.title.startswith("every other host unreachable from host-c since ")
    told = "host-a (ranks 0-1), host-b (ranks 2-3); host-c's own link (or its switch port) is the likely cut"
    assert told in lead.title


def test_never_reached_ranks_and_ended_ranks() -> None:
    # Never heard from by this viewer (a connect no host answered): no time to tell.
    snap = from_a()
    snap.job.unreachable_since = {4: 0.0, 5: 0.0}
    lead = diagnose(snap, {}, NOW)[0]
    assert lead.title == "host host-c (192.0.2.3) unreachable since before this viewer began: ranks 4-5", lead
    assert lead.since is None
    # Ranks whose ending is known are not unreachable: their end is another finding's.
    ended = [msgspec.structs.replace(s, status="crashed") if s.rank in (4, 5) else s for s in from_a().ranks]
    snap = build_snapshot("j", 6, ended, {}, NOW, PLACES, {4: CUT, 5: CUT})
    assert "host_unreachable" not in [f.kind for f in diagnose(snap, {}, NOW)]


def test_a_node_agents_verdict_is_told_as_its_own_to_a_viewer_that_began_after_the_cut() -> None:
    """A doctor started on host a after the cut never heard host c: the time and the verdict are
    host a's agent's (its exchange: host c's beats stopped), and the finding says so."""
    snap = from_a()
    snap.job.unreachable_seen_by = {4: "host-a", 5: "host-a"}
    lead = diagnose(snap, {}, NOW)[0]
    clock = time.strftime("%H:%M:%S", time.localtime(CUT))
    told = f"host host-c (192.0.2.3) unreachable since {clock}, as host-a's agent saw it: ranks 4-5"
    assert lead.title == told
    # Nothing but an address known of the host (no name in the store): the address alone.
    states = [s for s in snap.ranks if s.rank < 4]
    bare = build_snapshot("j", 6, states, {4: WHY, 5: WHY}, NOW, {r: ("", PLACES[r][1]) for r in range(6)},
                          {4: CUT, 5: CUT}, {4: "host-a", 5: "host-a"})
    assert diagnose(bare, {}, NOW)[0].title.startswith("host 192.0.2.3 unreachable since "), bare


def test_a_viewer_that_never_heard_the_host_takes_its_agents_time_and_word() -> None:
    """The fold: this viewer's own verdict first (a connect nobody answered: since 0), then what
    this host's node agent recorded (doctor reads it after watching): its time and its name stand."""
    model = JobModel(job_id="j", world_size=6)
    model.places.update(PLACES)
    for r in range(4):
        model.apply(StateMsg(state=hosted(in_collective(r, 37, world=6))))
    own = "no answer to a connect"
    for r in (4, 5):
        model.apply(ConnectionEvent(time=NOW - 1, rank=r, status=UNREACHABLE, reason=own))
        model.apply(ConnectionEvent(time=NOW, rank=r, status=UNREACHABLE, reason=WHY, since=CUT,
                                    seen_by="host-a"))
        model.apply(ConnectionEvent(time=NOW, rank=r, status=UNREACHABLE, reason=own))
    job = model.snapshot(NOW).job
    assert (job.unreachable_since, job.unreachable_seen_by) == ({4: CUT, 5: CUT}, {4: "host-a", 5: "host-a"})
    assert "as host-a's agent saw it: ranks 4-5" in diagnose(model.snapshot(NOW), {}, NOW)[0].title


def test_one_rank_waiting_is_told_in_the_singular() -> None:
    waiting = [hosted(in_collective(0, 37, world=6))]
    snap = build_snapshot("j", 6, waiting, {4: WHY, 5: WHY}, NOW, PLACES, {4: CUT, 5: CUT})
    lead = diagnose(snap, {}, NOW)[0]
    assert "rank 0 waits in gloo:all_reduce #37: it cannot finish without ranks 4-5" in lead.evidence, lead
