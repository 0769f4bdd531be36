"""A job at one moment: every rank's state plus what could not be reached.

``JobSnapshot`` is the document of ``ddptop snapshot --json`` (a public interface) and the
input of the diagnosis. Building one from live ranks lives in :func:`take_snapshot`.
"""

from __future__ import annotations

import time

import msgspec

from ddptop.client.collect import last_words, per_rank
from ddptop.client.connection import RankConnection
from ddptop.client.targets import JobTarget
from ddptop.protocol import RankState, StateMsg


class JobInfo(msgspec.Struct, kw_only=True):
    """Job-level facts of a snapshot."""

    id: str
    world_size: int
    time: float
    hosts: list[str] = []
    backend: str = ""
    answered: int = 0
    unreachable: dict[int, str] = {}  # rank -> why it did not answer


class JobSnapshot(msgspec.Struct, kw_only=True):
    """``{"job": {...}, "ranks": [...]}``."""

    job: JobInfo
    ranks: list[RankState]

    def by_rank(self) -> dict[int, RankState]:
        """Ranks keyed by rank number."""
        return {r.rank: r for r in self.ranks}


def build_snapshot(job_id: str, world_size: int, states: list[RankState],
                   unreachable: dict[int, str], now: float) -> JobSnapshot:
    """Assemble a snapshot from states (pure)."""
    states = sorted(states, key=lambda s: s.rank)
    backends = [s.backend for s in states if s.backend]
    info = JobInfo(
        id=job_id, world_size=max([world_size] + [s.world_size for s in states]), time=now,
        hosts=sorted({s.host for s in states}), backend=backends[0] if backends else "",
        answered=sum(1 for s in states if s.status not in ("lost", "crashed", "exited")),
        unreachable=dict(sorted(unreachable.items())),
    )
    return JobSnapshot(job=info, ranks=states)


def take_snapshot(target: JobTarget, token: str | None = None, timeout: float = 5.0) -> JobSnapshot:
    """Ask every live rank for its state; add dead ranks' last words."""

    def ask(conn: RankConnection) -> StateMsg:
        return conn.state()

    collected = per_rank(target, ask, token=token, timeout=timeout)
    states = [m.state for m in collected.answers.values() if isinstance(m, StateMsg)]
    states += [last_words(e) for e in target.dead]
    unreachable = dict(collected.errors)
    for rank in target.missing_ranks:
        unreachable.setdefault(rank, f"rank {rank}: no record found (not started, or on another host)")
    return build_snapshot(target.job_id, target.world_size, states, unreachable, time.time())
