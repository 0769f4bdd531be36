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
from concurrent.futures import ThreadPoolExecutor

from ddptop.client.connection import RankConnection
from ddptop.errors import DdptopError, UsageError
from ddptop.protocol import AgentReply, Event, RankExit, RankState, RecordEntry, StateMsg
from ddptop.store.discovery import Endpoint

VIA_ENV = "DDPTOP_VIA"
VIA_CHOICES = ("auto", "agent", "ranks")
MAX_PARALLEL = 32  # node agents asked at once by a one-shot collection



def via_agents(remote: bool, env: dict[str, str] | None = None) -> bool:
    """Whether a viewer of a *remote* (TCPStore) or local job goes through node agents."""
    via = (os.environ if env is None else env).get(VIA_ENV, "").strip().lower() or "auto"
    if via not in VIA_CHOICES:
        raise UsageError(f"{VIA_ENV}={via!r}: use one of {', '.join(VIA_CHOICES)}")
    return via == "agent" or (via == "auto" and remote)


def agent_endpoint(endpoint: Endpoint) -> Endpoint:
    """The endpoint of the node agent that serves *endpoint*'s rank (rank -1 names an agent)."""
    return Endpoint(job_id=endpoint.job_id, rank=-1, world_size=endpoint.world_size, host=endpoint.host,
                    port=endpoint.agent_port, pid=0, node=endpoint.node)


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
            agents.setdefault(where, (agent_endpoint(endpoint), []))[1].append(endpoint.rank)
    return direct, {agent: sorted(ranks) for agent, ranks in agents.values()}


def shifted(entry: Event, by: float) -> Event:
    """*entry* with its time moved onto this viewer's clock (*by*: ours minus the agent's)."""
    entry.time += by
    return entry


def reply_entries(reply: AgentReply, now: float) -> list[Event]:
    """A reply's entries, on this viewer's clock: their ages as the agent saw them are kept."""
    by = now - reply.time
    return [shifted(entry, by) for entry in reply.entries]


def states_via_agents(served: dict[Endpoint, list[int]], token: str | None,
                      timeout: float) -> tuple[list[RankState], dict[int, str]]:
    """Every served rank's state, one request per node agent (in parallel), and why the
    others have none: their agent did not answer, or it saw them end, or never heard of them."""
    def ask(agent: Endpoint) -> AgentReply:
        with RankConnection(agent, token=token, timeout=timeout) as conn:
            return conn.request("state", AgentReply)

    states: list[RankState] = []
    unreachable: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, max(1, len(served)))) as pool:
        asked = {agent: pool.submit(ask, agent) for agent in served}
        for agent, future in asked.items():
            ranks = served[agent]
            try:
                reply = future.result()
            except (DdptopError, OSError) as exc:
                unreachable.update((r, f"rank {r}: {exc}") for r in ranks)
                continue
            found = {e.rank: e.message.state for e in reply.entries
                     if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg)}
            exits = {e.rank: e for e in reply.entries if isinstance(e, RankExit)}
            for rank in ranks:
                if rank in found:
                    states.append(found[rank])
                gone = exits.get(rank)
                if gone is not None:
                    how = gone.signal or f"exit code {gone.exit_code}"
                    unreachable[rank] = f"rank {rank}: process {gone.pid} ended ({how}), its node agent saw"
                elif rank not in found:
                    unreachable[rank] = (f"rank {rank}: its node agent at {agent.host}:{agent.port} "
                                         "has not heard from it")
    return states, unreachable
