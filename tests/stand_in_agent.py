"""A stand-in for the node agent behind a real :class:`~ddptop.agent.endpoint.NodeEndpoint`.

What the endpoint asks the agent for (:class:`~ddptop.agent.endpoint.NodeAnswers`), as the
endpoint, exchange and digest tests and the exchange benchmark give it: no model, only events.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddptop.agent.serving import selected
from ddptop.protocol import Event


class StandInAgent:
    """Answers from *events* (called for each catch-up; none by default), cut as the agent
    cuts its own catch-up; no rank to ask, no news, this host's wall clock. Subclasses that
    know more override :meth:`events`, :meth:`ask` or :meth:`now`."""

    def __init__(self, events: Callable[[], list[Event]] = list) -> None:
        self._events = events

    def events(self) -> list[Event]:
        """Everything the agent knows about its ranks now."""
        return self._events()

    def catch_up(self, ranks: set[int] | None, samples: int | None) -> list[Event]:
        return selected(self.events(), ranks, samples)

    def ask(self, command: str, timeout: float) -> list[Event]:
        return []

    def news(self) -> list[Event]:
        return []

    def now(self) -> float:
        return time.time()
