"""A job at one moment: every rank's state plus what could not be reached.

``JobSnapshot`` is the document of ``ddptop snapshot --json`` (a public interface) and the
input of the diagnosis. Pure: a live job's comes from its model
(:meth:`ddptop.model.job.JobModel.snapshot`, read by :func:`ddptop.client.watch.live_snapshot`).
"""

from __future__ import annotations

import msgspec

from ddptop.frames import frame_text, user_frame
from ddptop.protocol import STUB_LOCAL_RANK, RankState
from ddptop.status import ENDED, Status


class JobInfo(msgspec.Struct, kw_only=True):
    """Job-level facts of a snapshot."""

    id: str
    world_size: int
    time: float
    hosts: list[str] = []
    backend: str = ""
    answered: int = 0
    unreachable: dict[int, str] = {}  # rank -> why it did not answer
    # Where each rank runs, as the job's store published it (the address other hosts reach it
    # at, and its host's name): a victim's "Connection closed by peer [addr]:port" names a host.
    addresses: dict[int, str] = {}
    nodes: dict[int, str] = {}
    # Ranks whose node agent is unreachable (connection open or opening, nothing back: a cut
    # link, a switch, a hung host), with when it was last heard from (0: never by this viewer).
    unreachable_since: dict[int, float] = {}
    # Of those, the ranks whose verdict (and time) is a node agent's, not this viewer's: that
    # agent's host (its exchange with the other agents: their beats stopped)
    unreachable_seen_by: dict[int, str] = {}


class JobSnapshot(msgspec.Struct, kw_only=True):
    """``{"job": {...}, "ranks": [...]}``."""

    job: JobInfo
    ranks: list[RankState]

    def by_rank(self) -> dict[int, RankState]:
        """Ranks keyed by rank number."""
        return {r.rank: r for r in self.ranks}


def build_snapshot(job_id: str, world_size: int, states: list[RankState],
                   unreachable: dict[int, str], now: float,
                   places: dict[int, tuple[str, str]] | None = None,
                   unreachable_since: dict[int, float] | None = None,
                   unreachable_seen_by: dict[int, str] | None = None) -> JobSnapshot:
    """Assemble a snapshot from states (pure)."""
    states = sorted(states, key=lambda s: s.rank)
    backends = [s.backend for s in states if s.backend]
    info = JobInfo(
        id=job_id, world_size=max([world_size] + [s.world_size for s in states]), time=now,
        hosts=sorted({s.host for s in states}), backend=backends[0] if backends else "",
        answered=sum(1 for s in states if s.status not in ENDED),
        unreachable=dict(sorted(unreachable.items())),
        addresses={r: address for r, (_node, address) in sorted((places or {}).items()) if address},
        nodes={r: node for r, (node, _address) in sorted((places or {}).items()) if node},
        unreachable_since=dict(sorted((unreachable_since or {}).items())),
        unreachable_seen_by=dict(sorted((unreachable_seen_by or {}).items())),
    )
    return JobSnapshot(job=info, ranks=states)


def with_last_known(live: JobSnapshot, known: dict[int, RankState], world_size: int,
                    now: float) -> JobSnapshot:
    """*live* with every rank of the job listed (#34 item 1): a rank that did not answer is
    its last known state from *known* (the job's black box, its progress page, the frame its
    node agent read from outside), status ``stale`` while the job has not seen it end; a rank
    nothing is known of is a stub with status ``unreachable``. ``job.unreachable`` keeps why
    each did not answer, with its last state's age and, where its node agent read it from
    outside, where it is (pure; the clock passed in)."""
    have = {s.rank for s in live.ranks}
    world = max(world_size, live.job.world_size, max(have, default=-1) + 1)
    added: list[RankState] = []
    for rank in range(world):
        if rank in have:
            continue
        state = known.get(rank)
        if state is None:
            added.append(RankState(rank=rank, local_rank=STUB_LOCAL_RANK, world_size=world, host="", pid=0,
                                   job_id=live.job.id, status=Status.UNREACHABLE))
        else:
            silent = state.status not in ENDED
            added.append(msgspec.structs.replace(state, status=Status.STALE) if silent else state)
            why = live.job.unreachable.get(rank, f"rank {rank}: did not answer")
            if state.time:
                why += f"; last state {max(0.0, now - state.time):.0f} s ago, at step {state.step}"
            frame = user_frame(state.stuck.frames) if state.stuck is not None else None
            if frame is not None:
                why += f"; at {frame_text(frame)} (read from outside by its node agent)"
            live.job.unreachable[rank] = why
    if not added:
        return live
    return JobSnapshot(job=live.job, ranks=sorted([*live.ranks, *added], key=lambda s: s.rank))
