"""A viewer for tests of synthetic jobs: a real LiveSource folding into a JobModel under a
lock, as the dashboard does (the ``watch`` fixture in conftest.py starts and stops them)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ddptop.client.live import LiveSource
from ddptop.client.targets import resolve
from ddptop.model.job import JobModel
from ddptop.protocol import Event


class Watched:
    """A LiveSource (through the agents' digest lane with *digest*) folding into a JobModel."""

    def __init__(self, job_id: str, digest: bool = False) -> None:
        self.model, self.lock = JobModel(), threading.Lock()
        self.source = LiveSource(resolve(job_id), connect_timeout=5.0, digest=digest)

    def emit(self, event: Event) -> None:
        with self.lock:
            self.model.apply(event)

    def read(self, fn: Callable[[JobModel], object]) -> object:
        with self.lock:
            return fn(self.model)

    def with_state(self) -> int:
        """How many ranks have sent a state."""
        return int(str(self.read(lambda m: sum(1 for v in m.ranks.values() if v.state is not None))))

    def pulses(self) -> int:
        """States this viewer rebuilt from its agents' digests (0: it got a frame per state)."""
        return sum(p.digest.pulses for p in self.source._agent_peers if p.digest is not None)
