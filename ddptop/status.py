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
    # Words a viewer uses beside a rank's status, never a rank's own (not in snapshot --json's
    # ``status``): a connection event's "connected", a rank not heard from yet ("unknown",
    # the dashboard), and one that did not answer a one-shot snapshot ("unreachable", its table).
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
