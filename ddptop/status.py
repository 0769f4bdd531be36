"""Status words of a rank: one vocabulary for the reporter, the model, the diagnosis and the UI.

A rank says ``starting`` / ``running`` of itself and leaves ``exited`` / ``crashed`` /
``terminated`` as last words; a viewer adds what only it can tell: ``stale`` (no state
for a while), ``lost`` (connection gone, no exit known) and ``torn_down`` (killed by the
launcher's teardown after another rank failed first: a victim, never a crash). The words
are a public interface (``snapshot --json``'s ``status``): add, never rename. ``Status``
is a ``StrEnum``, so every member also compares equal to its plain string.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Every status word a rank can have."""

    STARTING = "starting"
    RUNNING = "running"
    STALE = "stale"
    EXITED = "exited"  # ended by itself with code 0
    CRASHED = "crashed"  # exception, fatal signal or a non-zero exit
    TERMINATED = "terminated"  # the rank's own word: it got SIGTERM (who sent it is the viewer's call)
    # viewer's word: ended because another rank failed first: killed by the launcher's
    # teardown, or failed only because a peer was gone ("Connection closed by peer")
    TORN_DOWN = "torn_down"
    LOST = "lost"  # connection gone and no exit status known
    # Words a viewer uses beside a rank's status, never a rank's own: a connection event's
    # "connected", a rank not heard from yet ("unknown", the dashboard), and one that did not
    # answer a one-shot snapshot and of which nothing is known ("unreachable": its table, and
    # snapshot --json's ``status`` of that rank's stub since #34).
    CONNECTED = "connected"
    UNKNOWN = "unknown"
    UNREACHABLE = "unreachable"


# Still doing (or about to do) work.
ACTIVE: frozenset[str] = frozenset((Status.STARTING, Status.RUNNING, Status.STALE))
# The process is gone, whatever the reason.
ENDED: frozenset[str] = frozenset((Status.EXITED, Status.CRASHED, Status.TERMINATED, Status.TORN_DOWN,
                                   Status.LOST))
# What a rank reports as its final word (a state carrying one of these wins over "lost").
FINAL: frozenset[str] = frozenset((Status.EXITED, Status.CRASHED, Status.TERMINATED, Status.TORN_DOWN))


# When a rank that has not ended counts as silent, and when as stale: one rule for the node
# agent, the viewer and the model (every other threshold about a rank's silence derives here).
# ("Stuck", a counter that stopped moving on the rank's own clock, is the diagnosis's word:
# ddptop.diagnosis.desync. A node agent's own silence, its beats, is ddptop.agent.exchange's.)
SAMPLE_INTERVAL_S = 1.0  # a reporter's sampling interval unless DDPTOP_INTERVAL says otherwise
MISSED_SAMPLES = 2  # states missed in a row before a rank counts as silent
SILENCE_GRACE_S = 1.0  # on top: a loaded host delays a sample, it does not skip it
# Stale, the word a viewer shows: silent, and for long enough that the node agent (which acts
# at silence: it reads the rank's stack from outside) has had time to say where it is stuck,
# so a row turns stale with its reason rather than before it. The wait is only for that
# reason: a rank whose agent's report has come is stale from then on (its rank_unresponsive
# finding names it from the same report), and STALE_AFTER_S is for ranks no agent reads.
OUTSIDE_READ_S = 2.0
STALE_AFTER_S = MISSED_SAMPLES * SAMPLE_INTERVAL_S + SILENCE_GRACE_S + OUTSIDE_READ_S


def silent_after_s(interval_s: float = SAMPLE_INTERVAL_S) -> float:
    """Seconds without a state after which a rank sampled every *interval_s* is silent."""
    return MISSED_SAMPLES * max(0.05, interval_s) + SILENCE_GRACE_S
