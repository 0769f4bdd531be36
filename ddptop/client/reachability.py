"""Whether a node agent can still be reached: a silent host told apart from a closed connection.

A host whose link is cut (its cable, its switch port, a firewall), or that hangs whole,
closes nothing: its node agent's open connection just goes quiet, and a connection being
opened to it gets no answer, for as long as TCP keeps retrying (minutes). Waiting for a
close, a viewer learns nothing in time. So, for each node agent's connection:

* silent for :data:`PROBE_AFTER_S` once ready, it is asked a ``ping`` (any answer proves it
  reachable: an older agent's "unsupported request" as well);
* silent for :data:`UNREACHABLE_AFTER_S` (or, while being opened, with no answer to the
  connect), each rank it serves gets a ``ConnectionEvent`` "unreachable" with when the agent
  was last heard from; its connection stays open, for the link may come back;
* heard again: "connected", and its states follow.

A connect that fails with "no route to host", "network is unreachable" or a timeout is the
same verdict at once. Ranks reached directly are not judged here: a rank's own silence is
staleness (the model's, from time), and its closed connection is loss.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

from ddptop.client.live_requests import Peer
from ddptop.protocol import ConnectionEvent
from ddptop.status import Status
from ddptop.store.discovery import Endpoint

PROBE_AFTER_S = 3.0  # an agent sends every interval (states, digests, beats): 3 s is silence
# Then no answer to the probe either: well within the 15 s in which a person wants the host
# named, and far above the hiccups of a loaded machine (a viewer's own stalls are not silence:
# what arrived during them is read before this is judged).
UNREACHABLE_AFTER_S = 10.0
CHECK_EVERY_S = 1.0
# A connect that failed with one of these met no host: nothing refused it, nothing answered.
UNREACHABLE_ERRNOS = frozenset((errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT))


def agent_label(endpoint: Endpoint) -> str:
    """How a node agent is named in a reason: its host's name and where it listens (the
    viewer's probe and the agents' exchange say it alike)."""
    where = f"{endpoint.host}:{endpoint.port}"
    return f"node agent of {endpoint.node} at {where}" if endpoint.node else f"node agent at {where}"


def unreachable_events(peer: Peer, now: float, why: str) -> list[ConnectionEvent]:
    """The ranks *peer* serves, unreachable at *now* (wall clock) because of *why*."""
    peer.unreachable = True
    reason = f"{agent_label(peer.endpoint)}: {why}"
    return [ConnectionEvent(time=now, rank=rank, status=Status.UNREACHABLE, reason=reason,
                            since=peer.heard_wall) for rank in peer.serves]


def heard(peer: Peer, mono: float, now: float) -> list[ConnectionEvent]:
    """*peer* sent something at *mono* / *now*: "connected" again for its ranks, if they were
    unreachable (their next states say the rest)."""
    peer.heard_at, peer.heard_wall = mono, now
    if not peer.unreachable:
        return []
    peer.unreachable = False
    reason = f"{agent_label(peer.endpoint)} answers again"
    return [ConnectionEvent(time=now, rank=rank, status=Status.CONNECTED, reason=reason)
            for rank in peer.serves]


def check(peers: Sequence[Peer], mono: float, now: float,
          probe: Callable[[Peer], None]) -> list[ConnectionEvent]:
    """The agents among *peers* that went silent: a probe for the quiet ones (through
    *probe*), "unreachable" events for the ranks of those silent too long."""
    out: list[ConnectionEvent] = []
    for peer in peers:
        if peer.unreachable or peer.sock is None or not peer.serves:
            continue  # told already, or closed (its loss was told)
        silent = mono - peer.heard_at
        if silent >= UNREACHABLE_AFTER_S:
            if not peer.connected:
                why = f"no answer to a connect for {silent:.0f} s (nothing refused it)"
            elif not peer.ready:
                why = f"connected, but no answer to the handshake for {silent:.0f} s"
            else:
                why = (f"silent for {silent:.0f} s and no answer to a probe, its connection open (no close "
                       "came: a cut link, a switch, or a hung host look alike from here)")
            out += unreachable_events(peer, now, why)
        elif silent >= PROBE_AFTER_S and peer.ready and (peer.probe is None or peer.probe.done()):
            probe(peer)
    return out
