"""The one way a viewer fetches a live job: watch it through a :class:`LiveSource`, fold what
arrives into a :class:`~ddptop.model.job.JobModel` (through a :class:`ModelFeed`), read the model.

``snapshot`` watches until every rank has answered once, ``doctor`` until each sent two
states, ``export`` until each sent its history; the dashboard keeps watching. So every verb
sees the same statuses (``torn_down``, ``stale``, how a rank ended) from the same fold, and
no verb has a blocking per-rank path of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from ddptop.client.collect import GONE
from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget
from ddptop.model.snapshot import JobSnapshot
from ddptop.status import ENDED

# Reasons a model gives a rank it never heard from: in a snapshot they read as silence.
_NOT_HEARD = frozenset(("never seen", "no state received"))
# Addresses that name no host to a person on another one (a rank that serves on loopback).
_NO_PLACE = ("127.", "::1", "localhost", "0.0.0.0")


def endpoint_places(target: JobTarget) -> dict[int, tuple[str, str]]:
    """Where each rank runs (its host's name, its address), as its endpoint says (the job's
    store, this host's discovery entries): a viewer names a host it never reached, by name and
    address, as the node agents' records name it."""
    return {e.rank: (e.node, e.host) for e in target.endpoints if e.host and not e.host.startswith(_NO_PLACE)}


@contextmanager
def watching(target: JobTarget, feed: ModelFeed, *, token: str | None, connect_timeout: float = 5.0,
             read_stuck: bool = True, history: bool = True, digest: bool = False) -> Iterator[LiveSource]:
    """A live source feeding *feed* for the duration of the ``with`` block, stopped after
    (*digest*: through the node agents' digest lane where they offer it)."""
    source = LiveSource(target, token=token, connect_timeout=connect_timeout, read_stuck=read_stuck,
                        history=history, digest=digest)
    with feed.lock:
        for rank, place in endpoint_places(target).items():
            feed.model.places.setdefault(rank, place)
    source.start(feed.emit, pulses=feed.pulses)
    try:
        yield source
    finally:
        source.stop()


def live_snapshot(target: JobTarget, token: str | None, timeout_s: float) -> JobSnapshot:
    """Every rank's state now, as the job's model holds it after each rank answered once (or
    *timeout_s* ran out); ranks that did not answer are listed with why."""
    feed = ModelFeed(target.job_id, target.world_size)
    ranks = range(target.world_size)
    # No history (the present only) and no outside reads: a snapshot is one quick look.
    with watching(target, feed, token=token, connect_timeout=timeout_s, read_stuck=False, history=False):
        feed.wait_settled(ranks, timeout_s)
    with feed.lock:  # stop() joins the source's thread, but only for so long
        snap = feed.model.snapshot(time.time())
    return with_silence_named(snap, timeout_s)


def with_silence_named(snap: JobSnapshot, timeout_s: float) -> JobSnapshot:
    """*snap* with every rank that did not answer listed under ``job.unreachable``, each reason
    one line that starts with the rank: ranks that are gone (and what they left), ranks that
    never answered in *timeout_s*, ranks the model knows only by a reason (pure)."""
    unreachable = {rank: why if why.startswith(f"rank {rank}") else _reason(rank, why, timeout_s)
                   for rank, why in snap.job.unreachable.items()}
    for state in snap.ranks:
        if state.status in ENDED:
            # A dead rank still shows what it left behind, but it did not answer.
            how = f"{state.status}: {state.exit_reason}" if state.exit_reason else str(state.status)
            why = snap.job.unreachable.get(state.rank, "")
            after = f"; {why}" if why and why != GONE else ""
            unreachable[state.rank] = f"rank {state.rank}: process {state.pid} is gone ({how}){after}"
    snap.job.unreachable = dict(sorted(unreachable.items()))
    return snap


def _reason(rank: int, why: str, timeout_s: float) -> str:
    if why in _NOT_HEARD:
        return f"rank {rank}: no answer within {timeout_s:g} s"
    if why == "no discovery entry":
        return f"rank {rank}: no discovery entry found (not started, or on another host)"
    return f"rank {rank}: {why}"
