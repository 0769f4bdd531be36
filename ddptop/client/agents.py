"""Reaching ranks through their node agents: one connection per node, not per rank.

Every rank started by ``ddptop launch`` publishes, beside its own endpoint, the port of
its node's agent (:mod:`ddptop.agent.endpoint`), which serves all the ranks of that host
on one connection. Whether a viewer goes through the agents or to each rank is
``DDPTOP_VIA``:

* ``auto`` (the default): through the agents for a job read from its TCPStore
  (``HOST:PORT``, the multi-node case, where 512 nodes would otherwise cost 4096
  connections), straight to the ranks for a job on this host;
* ``agent``: through the agents wherever a rank names one;
* ``ranks``: always straight to every rank (the only way before agents served).

Ranks that name no agent (``ddptop.install()`` without a launcher) are reached directly
in every mode.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ddptop.errors import UsageError
from ddptop.protocol import AGENT_HELLO_RANK, AgentReply, Event
from ddptop.store.discovery import Endpoint

VIA_ENV = "DDPTOP_VIA"
VIA_CHOICES = ("auto", "agent", "ranks")



def via_agents(remote: bool, env: dict[str, str] | None = None) -> bool:
    """Whether a viewer of a *remote* (TCPStore) or local job goes through node agents."""
    via = (os.environ if env is None else env).get(VIA_ENV, "").strip().lower() or "auto"
    if via not in VIA_CHOICES:
        raise UsageError(f"{VIA_ENV}={via!r}: use one of {', '.join(VIA_CHOICES)}")
    return via == "agent" or (via == "auto" and remote)


def agent_endpoint(endpoint: Endpoint) -> Endpoint:
    """The endpoint of the node agent that serves *endpoint*'s rank (``AGENT_HELLO_RANK``
    as its rank: an agent serves many)."""
    return Endpoint(job_id=endpoint.job_id, rank=AGENT_HELLO_RANK, world_size=endpoint.world_size,
                    host=endpoint.host, port=endpoint.agent_port, pid=0, node=endpoint.node)


def split(endpoints: Sequence[Endpoint],
          through_agents: bool) -> tuple[list[Endpoint], dict[Endpoint, list[int]]]:
    """Ranks to reach directly, and each node agent with the ranks it serves."""
    if not through_agents:
        return list(endpoints), {}
    direct: list[Endpoint] = []
    agents: dict[tuple[str, int], tuple[Endpoint, list[int]]] = {}
    for endpoint in endpoints:
        where = endpoint.via_agent
        if where is None:
            direct.append(endpoint)
        else:
            # The agent's endpoint once per node, not per rank (32,768 of them at an attach).
            served = agents.get(where)
            if served is None:
                served = agents[where] = (agent_endpoint(endpoint), [])
            served[1].append(endpoint.rank)
    return direct, {agent: sorted(ranks) for agent, ranks in agents.values()}


def shifted(entry: Event, by: float) -> Event:
    """*entry* with its time moved onto this viewer's clock (*by*: ours minus the agent's)."""
    entry.time += by
    return entry


def reply_entries(reply: AgentReply, by: float) -> list[Event]:
    """A reply's entries, on this viewer's clock (*by*: ours minus the agent's, a
    :class:`ClockOffset`'s estimate): their ages as the agent saw them are kept."""
    return [shifted(entry, by) for entry in reply.entries]


class ClockOffset:
    """Our clock minus a node agent's, told apart from the time its messages spent on the way.

    A message the agent stamped at its time T and we read at our time t bounds the offset
    from above only: ours - agent's <= t - T, the rest being time it waited in the agent's
    output buffer, the network or our own backlog. Taking every message's t - T as the
    offset made a backlog invisible: a node whose digests were read four minutes late was
    shown as now, and its ranks, seen before they entered a collective, were named as ranks
    that never entered it (tests/test_scale_32k.py, on a loaded machine). The estimate is the
    least bound seen; it rises above it only as fast as a clock slews (:data:`MAX_SLEW`), so
    a sustained backlog shows as age while a clock that was stepped back is followed in time.
    """

    MAX_SLEW = 1e-3  # s/s: NTP slews at most 500 ppm; a backlog grows far faster than this

    def __init__(self) -> None:
        self._estimate: float | None = None
        self._at = 0.0  # our time of the last bound

    @property
    def value(self) -> float:
        """The estimate (0.0 before the first message: the clocks taken as equal)."""
        return 0.0 if self._estimate is None else self._estimate

    def observe(self, ours: float, theirs: float) -> float:
        """A message stamped *theirs* read at *ours*: the estimate after it."""
        bound = ours - theirs
        if self._estimate is None or bound <= self._estimate:
            self._estimate = bound
        else:  # above the estimate: mostly delay; only a slewing or stepped clock moves it up
            self._estimate = min(bound, self._estimate + self.MAX_SLEW * max(0.0, ours - self._at))
        self._at = ours
        return self._estimate
