"""A job at one moment: every rank's state plus what could not be reached.

``JobSnapshot`` is the document of ``ddptop snapshot --json`` (a public interface) and the
input of the diagnosis. Pure: a live job's comes from its model
(:meth:`ddptop.model.job.JobModel.snapshot`, read by :func:`ddptop.client.watch.live_snapshot`).
"""

from __future__ import annotations

import msgspec

from ddptop.protocol import RankState
from ddptop.status import ENDED


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


class JobSnapshot(msgspec.Struct, kw_only=True):
    """``{"job": {...}, "ranks": [...]}``."""

    job: JobInfo
    ranks: list[RankState]

    def by_rank(self) -> dict[int, RankState]:
        """Ranks keyed by rank number."""
        return {r.rank: r for r in self.ranks}


def build_snapshot(job_id: str, world_size: int, states: list[RankState],
                   unreachable: dict[int, str], now: float,
                   places: dict[int, tuple[str, str]] | None = None) -> JobSnapshot:
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
    )
    return JobSnapshot(job=info, ranks=states)
