"""This node's side of the agents' exchange, as the node agent drives it.

The node agent (:mod:`ddptop.agent.node`) tells :class:`NodeNews` each local ending and
stuck report (:meth:`NodeNews.tell`), calls :meth:`NodeNews.beat` from its loop, and hands
each newly found local rank to :meth:`NodeNews.rank_found`: the first one of a multi-node
torchrun job starts the :class:`~ddptop.agent.exchange.Exchange` with the other agents,
through the job's TCPStore (MASTER_ADDR:MASTER_PORT, read from that rank's environment in
/proc: the rank itself is not touched). What the other agents tell goes to *on_remote*.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ddptop.agent.exchange import BEAT_S, Exchange
from ddptop.bundle.format import ADDRESS_FACT, Frame, HostFacts
from ddptop.protocol import AgentBeat, Event
from ddptop.store import jobrecord
from ddptop.store.discovery import Endpoint

if TYPE_CHECKING:
    from ddptop.agent.endpoint import NodeEndpoint

log = logging.getLogger(__name__)

MAX_NEWS_KEPT = 512  # this node's news kept for agents that connect late (endings, stuck reports)
MAX_ENVIRON = 1 << 20
SETTLE_S = 10.0  # at the end, how long the other agents may still tell how their ranks ended


class NodeNews:
    """This node's news (for the other agents) and the exchange that brings theirs."""

    def __init__(self, job_id: str, host: str, on_remote: Callable[[Frame], None]) -> None:
        self.job_id = job_id
        self.host = host
        self._endpoint: NodeEndpoint | None = None
        self._token: str | None = None
        self._on_remote = on_remote
        self._lock = threading.Lock()
        self._told: list[Event] = []
        self._beat_at = 0.0
        self.exchange: Exchange | None = None
        self._places: dict[int, tuple[str, str]] = {}  # rank -> (host name, address) told so far

    def serve(self, endpoint: NodeEndpoint, token: str | None) -> None:
        """Tell the news through *endpoint* (the node's one endpoint); until then, nothing is."""
        self._endpoint, self._token = endpoint, token

    def rank_found(self, endpoint: Endpoint) -> None:
        """With the first local rank of a multi-node job: find the other agents in its store."""
        self._tell_places({endpoint.rank: (endpoint.node, endpoint.host)})
        if self.exchange is not None or self._endpoint is None or endpoint.agent_port != self._endpoint.port:
            return
        env = rank_environ(endpoint.pid)
        addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
        local, world = env.get("LOCAL_WORLD_SIZE", ""), env.get("WORLD_SIZE", "")
        if not addr or not port.isdigit() or (local and local == world) or env.get("SLURM_NNODES") == "1":
            return  # no store, or one node (torchrun's or SLURM's word): nobody to exchange with
        own = endpoint.via_agent
        assert own is not None

        def keep(world: int, endpoints: list[Endpoint]) -> None:
            try:  # beside job.json: viewers on this host need not read the store themselves
                jobrecord.write_store_copy(self.job_id, endpoint.store, world, endpoints)
            except (OSError, ValueError) as exc:
                log.warning("ddptop agent: the store's copy not kept: %s", exc)

        self.exchange = Exchange(self.job_id, self._token, self._on_remote, own, host=self.host,
                                 on_store=keep if endpoint.store else None)
        self.exchange.start((addr, int(port)))

    def tell(self, entry: Event) -> None:
        """Send one of this node's endings or stuck reports to the other agents."""
        if self._endpoint is None:
            return
        with self._lock:
            self._told.append(entry)
            del self._told[:-MAX_NEWS_KEPT]
        self._endpoint.publish(entry, news=True)

    def catch_up(self) -> list[Event]:
        """This node's news so far, for an agent that connects now."""
        with self._lock:
            return list(self._told)

    def beat(self, steps: dict[int, int]) -> None:
        """Tell the other agents this one lives, with each local rank's step (every BEAT_S)."""
        if self.exchange is not None:
            self._tell_places(self.exchange.places())
        if self._endpoint is None or time.monotonic() - self._beat_at < BEAT_S:
            return
        self._beat_at = time.monotonic()
        ranks = sorted(steps)
        self._endpoint.publish(AgentBeat(time=time.time(), host=self.host, ranks=ranks,
                                         steps=[steps[r] for r in ranks]), news=True)

    def _tell_places(self, places: dict[int, tuple[str, str]]) -> None:
        """Where ranks run, as the job's store published it, into this node's recording (once per
        change): a victim's "Connection closed by peer [addr]" then names a host and its ranks."""
        new = {rank: place for rank, place in places.items() if place[1] and self._places.get(rank) != place}
        self._places.update(new)
        by_place: dict[tuple[str, str], list[int]] = {}
        for rank, place in new.items():
            by_place.setdefault(place, []).append(rank)
        for (node, address), ranks in sorted(by_place.items()):
            self._on_remote(HostFacts(host=node, ranks=sorted(ranks), facts={ADDRESS_FACT: address}))

    def summary(self) -> str:
        """The exchange in one line, for job.json ("" on one node)."""
        return self.exchange.summary() if self.exchange is not None else ""

    def finish(self, ranks: list[int]) -> str:
        """The job ended here: let the others tell how it ended there (bounded), say goodbye
        (so this node is not taken for lost), stop; the exchange's summary."""
        if self.exchange is not None:
            self.exchange.settle(SETTLE_S)
            self.exchange.close()
        if self._endpoint is not None:
            goodbye = AgentBeat(time=time.time(), host=self.host, ranks=ranks, ending=True)
            self._endpoint.publish(goodbye, news=True)
        return self.summary()


def rank_environ(pid: int) -> dict[str, str]:
    """A local rank's environment, read from /proc (read only: the rank is not touched)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read(MAX_ENVIRON)
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}
