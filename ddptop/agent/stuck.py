"""Silence and outside reads: where a local rank that stopped answering is stuck.

The node agent tells :class:`StuckWatch` when each rank was last heard from
(:meth:`StuckWatch.heard`) and asks it, from its loop, to read every rank silent for too
long (:meth:`StuckWatch.read_silent`). The read runs from outside, on the
:class:`~ddptop.agent.outside.OutsideReader`'s thread (py-spy, faulthandler's signal, /proc);
its report is left in ``<job>.<rank>.stuck`` in the runtime directory for viewers on this
host, and handed to the agent (*on_stuck*), which puts it into the black box and tells the
other nodes. A rank that answers again loses its ``.stuck`` file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from ddptop.agent.outside import OutsideReader, Silence
from ddptop.protocol import StuckReport
from ddptop.store import discovery

log = logging.getLogger(__name__)

PidOf = Callable[[int], "int | None"]  # a local rank's current pid (None: not known)


class StuckWatch:
    """Which local ranks are silent, and what was read from outside of them."""

    def __init__(self, job_id: str, pid_of: PidOf, on_stuck: Callable[[StuckReport], None]) -> None:
        self.job_id = job_id
        self._pid_of = pid_of
        self._on_stuck = on_stuck
        # Own lock: taken by the agent's threads and the outside reader's; never held while
        # calling out (on_stuck), so it nests inside the agent's lock and never around it.
        self._lock = threading.Lock()
        self._silence = Silence()
        self._stuck: set[int] = set()  # ranks whose .stuck file is written
        self._outside = OutsideReader(self._reported)

    def heard(self, rank: int, at: float, final: bool) -> None:
        """A state of *rank* arrived (*final*: its last words, or its exit): not silent."""
        with self._lock:
            if final:
                self._silence.forget(rank)
            else:
                self._silence.heard(rank, at)
            if rank in self._stuck:
                self._stuck.discard(rank)
                self._outside.answered(rank)
                self._stuck_path(rank).unlink(missing_ok=True)

    def forget(self, rank: int) -> None:
        """A new process of *rank* (torchrun restarted it): judged afresh."""
        with self._lock:
            self._silence.forget(rank)

    def read_silent(self) -> None:
        """Ask the outside reader (its own thread, rate-limited) about every silent rank."""
        with self._lock:
            silent = self._silence.silent(time.time())
        for rank, since in silent:
            pid = self._pid_of(rank)
            if pid is not None and discovery.pid_alive(pid):
                self._outside.request(rank, pid, since, discovery.rank_file(self.job_id, rank, "crash"))

    def close(self) -> None:
        """Stop reading."""
        self._outside.close()

    def _stuck_path(self, rank: int) -> Path:
        return discovery.rank_file(self.job_id, rank, "stuck")

    def _reported(self, report: StuckReport) -> None:
        # On the outside reader's thread: for viewers on this host first, then to the agent.
        with self._lock:
            still_silent = report.rank in {r for r, _ in self._silence.silent(time.time())}
            if self._pid_of(report.rank) != report.pid or not still_silent:
                return  # it answered (or ended) while it was being read
            self._stuck.add(report.rank)
            try:
                discovery.private_write(self._stuck_path(report.rank), msgspec.msgpack.encode(report))
            except OSError as exc:
                log.warning("ddptop agent: cannot write rank %d's stuck report: %s", report.rank, exc)
        self._on_stuck(report)
