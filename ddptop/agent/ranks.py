"""Rank watching and exits: this host's ranks of one job, each process watched until it ends.

:meth:`LocalRanks.scan` finds the job's ranks in the runtime directory (a rank publishes its
endpoint there when its reporter starts, again when torchrun restarts it) and starts watching
each new process: its exit (:class:`~ddptop.agent.exits.ExitWatcher`), its memory cgroup (was
a SIGKILL the OOM killer's?) and its SLURM job (did SLURM stop it?). When one ends,
:meth:`LocalRanks.ending` gathers what tells how, before anything is cleaned up: the rank's
last words (or its last sample with its progress page laid over), its crash file, and the
exit itself with the cause found. The node agent (:mod:`ddptop.agent.node`) puts those events
into its model and the black box.
"""

from __future__ import annotations

import logging
import threading
import time

from ddptop.agent.exits import ExitWatcher, ProcessExit
from ddptop.agent.news import rank_environ
from ddptop.agent.oom import MemoryWatch
from ddptop.agent.recording import crash_frame
from ddptop.agent.scheduler import SchedulerWatch
from ddptop.agent.stderr_tail import CONSOLE_FILE
from ddptop.bundle.format import Frame
from ddptop.errors import DdptopError
from ddptop.evidence.fold import exit_told
from ddptop.evidence.torchrun_log import read_torchrun_log
from ddptop.protocol import RankExit, RankState, RecordEntry, StateMsg
from ddptop.store import discovery, jobrecord, remains
from ddptop.store.discovery import Endpoint
from ddptop.store.remains import MAX_CRASH_READ, has_stacks, read_text_tail

CGROUPS_EVERY_S = 5.0  # each rank's memory cgroup read again (one /proc read a rank)

log = logging.getLogger(__name__)


class LocalRanks:
    """The job's ranks on this host, as the runtime directory names them, and their processes."""

    def __init__(self, job_id: str, host: str) -> None:
        self.job_id = job_id
        self.host = host
        self.endpoints: dict[int, Endpoint] = {}  # rank -> its endpoint (its current pid); the agent's thread
        # The watchers are fed on the agent's thread and counted from others (running).
        self._lock = threading.Lock()
        self._exits = ExitWatcher()
        self._memory = MemoryWatch()
        self._scheduler = SchedulerWatch()
        self._cgroups_due = 0.0  # monotonic: when the ranks' cgroups are looked at again

    @property
    def running(self) -> int:
        """Processes of ranks that have not ended yet."""
        with self._lock:
            return self._exits.watching

    def pids(self) -> dict[int, int]:
        """rank -> the pid of its current process, of every rank found so far."""
        return {rank: endpoint.pid for rank, endpoint in list(self.endpoints.items())}

    def pid_of(self, rank: int) -> int | None:
        """The pid of *rank*'s current process (None: no such rank here)."""
        endpoint = self.endpoints.get(rank)
        return endpoint.pid if endpoint is not None else None

    def scan(self) -> tuple[list[Endpoint], list[Endpoint]]:
        """Look at the runtime directory: (every endpoint that is new or changed, a rank's new
        agent port included; the new processes among them, watched from now on)."""
        changed: list[Endpoint] = []
        started: list[Endpoint] = []
        for endpoint in discovery.jobs_on_host(include_stale=True).get(self.job_id, []):
            known = self.endpoints.get(endpoint.rank)
            if known is not None and (known.pid, known.agent_port) == (endpoint.pid, endpoint.agent_port):
                continue
            self.endpoints[endpoint.rank] = endpoint
            changed.append(endpoint)
            if known is not None and known.pid == endpoint.pid:
                continue  # the same process, now naming this agent (install() spawned it)
            started.append(endpoint)
            environ = rank_environ(endpoint.pid)  # read while it lives: SLURM's word on it
            with self._lock:
                self._exits.watch(endpoint.rank, endpoint.pid)
                self._memory.watch(endpoint.rank, endpoint.pid)
                self._scheduler.watch(endpoint.rank, endpoint.pid, environ)
        return changed, started

    def exits(self, timeout: float) -> list[ProcessExit]:
        """Ranks' processes that ended (waiting up to *timeout*), each once; the end of an
        earlier process of a restarted rank is not the rank's."""
        if time.monotonic() >= self._cgroups_due:  # a rank moved into another cgroup (#55)
            self._cgroups_due = time.monotonic() + CGROUPS_EVERY_S
            with self._lock:
                for rank, endpoint in list(self.endpoints.items()):
                    self._memory.follow(rank, endpoint.pid)
        ended = self._exits.poll(timeout)
        return [gone for gone in ended if self.pid_of(gone.key) == gone.pid]

    def ending(self, gone: ProcessExit, seen: RankState | None) -> list[Frame]:
        """What tells how *gone* ended, in the order it goes into the recording: its last words
        (unless they are *seen*, the last state the agent has), its crash file if it holds a
        traceback, and its exit, last."""
        rank = gone.key
        events: list[Frame] = []
        state = remains.read_final_state(self.job_id, rank, gone.pid, seen)
        if state is not None and state is not seen:
            events.append(RecordEntry(time=gone.time, rank=rank, message=StateMsg(state=state)))
        path = discovery.rank_file(self.job_id, rank, "crash")
        text, _cut = read_text_tail(path, MAX_CRASH_READ)
        if has_stacks(text):
            events.append(crash_frame(rank, path.name, text, MAX_CRASH_READ))
        # Reaped by torchrun before its status could be read: the kernel's and the cgroup's
        # record of an OOM kill still tell (a SIGKILL then); else the status stays unknown.
        oom = self._memory.verdict(rank, gone.pid, gone.signal if gone.known else "SIGKILL")
        signal = gone.signal or ("SIGKILL" if oom.cause and not gone.known else "")
        cause = oom.cause or self._scheduler.verdict(rank, gone.pid, signal)
        endpoint = self.endpoints.get(rank)
        events.append(RankExit(time=gone.time, rank=rank, pid=gone.pid,
                               host=(endpoint.node if endpoint is not None else "") or self.host,
                               exit_code=gone.exit_code, signal=signal, cause=cause,
                               memory_limit_bytes=oom.limit_bytes, memory_peak_bytes=oom.peak_bytes))
        return events

    def told_by_torchrun(self, unknown: dict[int, RankExit]) -> list[RankExit]:
        """The exits of *unknown* (rank -> its exit whose status could not be read: torchrun
        reaped the process before the agent read its zombie) with the status torchrun's failure
        summary gives for the same pid, read from the job's stderr as the record directory
        keeps it (capped: its last MAX_LOG_BYTES)."""
        console = jobrecord.job_dir(self.job_id) / CONSOLE_FILE
        if not unknown or not console.is_file():
            return []
        try:
            failures = read_torchrun_log(console)
        except DdptopError as exc:
            log.warning("ddptop agent: %s", exc)
            return []
        return [told for failure in failures if failure.rank in unknown
                for told in exit_told(unknown[failure.rank], failure)]

    def close(self) -> None:
        """Stop watching."""
        with self._lock:
            self._exits.close()
