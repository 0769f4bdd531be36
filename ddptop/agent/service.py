"""What the node agent serves, and from what: its endpoint and its Prometheus metrics.

The node's one endpoint (:class:`~ddptop.agent.endpoint.NodeEndpoint`, for viewers and the
other nodes' agents) and the metrics server (:mod:`ddptop.agent.metrics_http`) both read the
agent's model, through :class:`NodeService`: about this node's ranks only, as the model holds
them now. The model also holds what the exchange told of other nodes' ranks; those are their
own agents' to serve. Both servers are imported when first asked for: an agent that serves
neither never loads them (nor ``prometheus_client``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ddptop.agent.jobfiles import JobFiles
from ddptop.agent.news import NodeNews
from ddptop.agent.serving import ask_ranks, model_catch_up
from ddptop.client.live import LiveSource
from ddptop.model.job import JobModel
from ddptop.protocol import Event

if TYPE_CHECKING:
    from ddptop.agent.endpoint import NodeEndpoint
    from ddptop.agent.metrics import AgentView
    from ddptop.agent.metrics_http import MetricsServer


class NodeService:
    """The agent's endpoint and metrics server, and their answers (a
    :class:`~ddptop.agent.endpoint.NodeAnswers`) read off *model* under *lock*, the agent's.

    *remote* is the agent's set of other nodes' ranks (read here under *lock*).
    """

    def __init__(self, job_id: str, host: str, model: JobModel, lock: threading.Lock, remote: set[int],
                 live: LiveSource, news: NodeNews, files: JobFiles) -> None:
        self.job_id, self.host = job_id, host
        self.endpoint: NodeEndpoint | None = None
        self.metrics: MetricsServer | None = None
        self._model, self._lock, self._remote = model, lock, remote
        self._live, self._news, self._files = live, news, files

    def serve(self, bind: str, token: str | None, port: int = 0) -> int:
        """Open the node's endpoint on *bind*; its port (OSError if unbindable)."""
        from ddptop.agent.endpoint import NodeEndpoint

        self.endpoint = NodeEndpoint(bind, port, token, self.job_id, self, host=self.host)
        self._news.serve(self.endpoint, token)
        return self.endpoint.port

    def serve_metrics(self, listen: tuple[str, int]) -> str:
        """Serve Prometheus metrics on *listen*; the URL (OSError if unbindable)."""
        from ddptop.agent.metrics import JobCollector, registry_for
        from ddptop.agent.metrics_http import MetricsServer

        self.metrics = MetricsServer(registry_for(JobCollector(self.metrics_view)), listen)
        return self.metrics.url

    def publish(self, event: Event) -> None:
        """*event* out to this node's viewers, if serving."""
        if self.endpoint is not None:
            self.endpoint.publish(event)

    def close(self) -> None:
        """Stop serving (after the last exits went out to the viewers)."""
        if self.endpoint is not None:
            self.endpoint.close()
        if self.metrics is not None:
            self.metrics.close()

    def local_ranks(self) -> set[int]:
        """The ranks of this node that the model knows of (under the lock)."""
        return set(self._model.ranks) - self._remote

    # ------------------------------------------------------------ the endpoint's answers

    def catch_up(self, ranks: set[int] | None = None, samples: int | None = None) -> list[Event]:
        """Everything known about each local rank (of *ranks*) now, its last *samples* of
        history: what a viewer that connects gets first, or asks of some ranks."""
        with self._lock:
            local = self.local_ranks() if ranks is None else self.local_ranks() & ranks
            return model_catch_up(self._model, local, time.time(), samples)

    def ask(self, command: str, timeout: float) -> list[Event]:
        """Stacks or FR dumps of every local rank that still runs (see :func:`ask_ranks`)."""
        with self._lock:
            local = self.local_ranks()
        return ask_ranks(self._live, self._model, self._lock, local, command, timeout)

    def news(self) -> list[Event]:
        """This node's news so far, for an agent that connects now."""
        return self._news.catch_up()

    def now(self) -> float:
        """The agent's wall clock."""
        return time.time()

    def metrics_view(self, now: float) -> AgentView:
        """One consistent read of the model for a scrape: this node's ranks only."""
        from ddptop.agent.metrics import AgentView

        with self._lock:
            snapshot = self._model.snapshot(now)
            histories = self._model.histories()
            recording_bytes = self._files.recording_bytes
            local = self.local_ranks()
        return AgentView.local(self.job_id, self.host, snapshot, histories, recording_bytes, local)
