"""One selector loop for any number of rank servers (with their time limits) or viewer peers.

A rank's server makes a private, wakeable loop; the synthetic job (``ddptop.testing.synthetic``)
puts thousands of fake ranks' servers on one; a viewer's live source runs its connections to
every rank or node agent on one. Every registered socket's data is an
object with ``on_ready(events)``; every server added to ``servers`` is swept for time
limits twice a second (:mod:`ddptop.net.limits`).
"""

from __future__ import annotations

import selectors
import socket
import time
from typing import Protocol

from ddptop.net import limits


class Sweepable(Protocol):
    """A server whose peers have time limits."""

    def sweep(self, now: float) -> None:
        """Close peers that overstayed, at monotonic time *now*."""


class Ready(Protocol):
    """What a registered socket's selector data is."""

    def on_ready(self, events: int) -> None:
        """Handle the selector *events* of this socket."""


class ServerLoop:
    """One selector driving the listeners and viewers of any number of :class:`ReporterServer`.

    A rank owns one server and lets it make a private loop; the synthetic job puts thousands
    of servers on one loop, since a selector per rank (an epoll fd and a poll call each)
    does not scale to 4096 ranks in one thread.
    """

    def __init__(self, wakeable: bool = False) -> None:
        self.selector = selectors.DefaultSelector()
        self.servers: list[Sweepable] = []
        self._next_sweep = 0.0
        self.polls = 0  # wake-ups so far (how many frames a poll serves: a bench's measure)
        # A loop polled by a thread that must stop promptly (a rank's reporter at exit, the
        # synthetic job) needs waking; shared loops driven inline do not pay for the pair.
        self._wake: tuple[socket.socket, socket.socket] | None = None
        if wakeable:
            self._wake = socket.socketpair()
            self._wake[0].setblocking(False)
            self.selector.register(self._wake[0], selectors.EVENT_READ, None)

    def poll(self, timeout: float, gather_s: float = 0.0) -> int:
        """Serve every registered socket for up to *timeout* seconds; how many were ready.

        *gather_s*: nap that long after serving, when any was ready. Many peers that each
        send at their own moment, served as they come, make a poll per frame (3,000 wake-ups
        a second at 32,768 ranks, a third of a viewer's ingest CPU): napped, one poll serves
        dozens."""
        ready = self.selector.select(timeout)
        self.polls += 1
        for key, events in ready:
            owner = key.data
            if owner is not None:
                owner.on_ready(events)
            elif self._wake is not None:
                try:
                    self._wake[0].recv(4096)
                except OSError:
                    pass
        now = time.monotonic()
        if now >= self._next_sweep:  # time limits: checked twice a second, not per event
            self._next_sweep = now + limits.SWEEP_INTERVAL_S
            for server in self.servers:
                server.sweep(now)
        if ready and gather_s > 0:
            time.sleep(gather_s)
        return len(ready)

    def wake(self) -> None:
        """Interrupt a :meth:`poll` running in another thread (needs ``wakeable=True``)."""
        if self._wake is not None:
            try:
                self._wake[1].send(b"x")
            except OSError:
                pass

    def unregister(self, sock: socket.socket) -> None:
        """Forget *sock* (already forgotten or closed is fine)."""
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def close(self) -> None:
        """Close the wake pair and the selector (the servers close their own sockets)."""
        for sock in self._wake or ():
            self.unregister(sock)
            sock.close()
        self.selector.close()
