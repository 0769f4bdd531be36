"""The node agent: one per job and host, it outlives the ranks and keeps their record.

``ddptop launch`` runs it on a thread beside the command it launched. It

* finds the job's local ranks in the runtime directory, subscribes to each (a ``LiveSource``)
  and writes all they send into the black box (:class:`~ddptop.agent.recording.JobRecording`);
* watches every rank's process from outside (:class:`~ddptop.agent.exits.ExitWatcher`):
  when one ends, it records how (exit code or signal), its last words, its crash file and
  the crash files of its dead DataLoader workers, before anything is cleaned up;
* reads a rank that stops answering from outside (:mod:`ddptop.agent.outside`: py-spy,
  faulthandler's signal, /proc) and leaves where it is stuck in ``<job>.<rank>.stuck`` for
  viewers on this host, and in the black box;
* keeps ``job.json`` (:mod:`ddptop.store.jobrecord`) current: ``jobs``, ``doctor``, ``replay``;
* serves its model of the job as Prometheus metrics when asked (:mod:`ddptop.agent.metrics`);
* exchanges news with the job's other node agents (:mod:`ddptop.agent.news`): what they tell
  goes into this black box too, so any surviving node's record tells the whole job's ending.

Nothing here runs inside a rank: the cost of recording is the agent's, never training's.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import msgspec

from ddptop import auth
from ddptop._version import __version__
from ddptop.agent.exchange import news_stacks, news_state
from ddptop.agent.exits import ExitWatcher, ProcessExit
from ddptop.agent.news import NodeNews, rank_environ
from ddptop.agent.oom import MemoryWatch
from ddptop.agent.outside import OutsideReader, Silence
from ddptop.agent.recording import JobRecording, crash_frame
from ddptop.agent.scheduler import SchedulerWatch
from ddptop.agent.serving import ask_ranks, model_catch_up
from ddptop.bundle.format import ADDRESS_FACT, SCHEMA_VERSION, Frame, HostFacts, Manifest
from ddptop.client.live import LiveSource
from ddptop.client.targets import JobTarget
from ddptop.errors import DdptopError
from ddptop.model.job import JobModel
from ddptop.protocol import (
    ConnectionEvent,
    Event,
    RankExit,
    RecordEntry,
    StacksMsg,
    StateMsg,
    StuckReport,
)
from ddptop.status import FINAL, Status
from ddptop.store import discovery, jobrecord, remains
from ddptop.store.discovery import Endpoint
from ddptop.store.jobrecord import JobRecord, RankOutcome
from ddptop.store.remains import MAX_CRASH_READ, has_stacks, read_text_tail

if TYPE_CHECKING:  # prometheus_client is imported only by a launch that serves metrics
    from ddptop.agent.endpoint import NodeEndpoint
    from ddptop.agent.metrics import AgentView
    from ddptop.agent.metrics_http import MetricsServer

log = logging.getLogger(__name__)

SCAN_S = 0.2  # how often the runtime directory is looked at for new ranks
RECORD_EVERY_S = 2.0  # job.json rewrite cadence while nothing ends


class NodeAgent:
    """Records one job on this host until :meth:`finish` is called."""

    def __init__(self, job_id: str, command: list[str], cap_bytes: int, *, record: bool = True) -> None:
        self.job_id = job_id
        self.host = socket.gethostname()
        self.record = JobRecord(job_id=job_id, host=self.host, command=list(command),
                                agent_pid=os.getpid(), start_time=time.time(),
                                ddptop_version=__version__)
        self.model = JobModel(job_id=job_id)  # what the agent knows: exits and final states
        self._lock = threading.Lock()
        self._known: dict[int, Endpoint] = {}  # rank -> endpoint (its current pid)
        self._exits = ExitWatcher()
        self._memory = MemoryWatch()  # each rank's memory cgroup: was a SIGKILL the OOM killer's?
        self._scheduler = SchedulerWatch()  # each rank's SLURM job: did SLURM stop it?
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._record_written = 0.0
        self._record_warned = False
        self._silence = Silence()  # guarded by self._lock
        self._stuck: set[int] = set()  # ranks with a .stuck file written (guarded by self._lock)
        self._outside = OutsideReader(self._on_stuck)
        self.recording: JobRecording | None = None
        self._metrics: MetricsServer | None = None
        self._endpoint: NodeEndpoint | None = None
        self._news = NodeNews(job_id, self.host, self._remote)  # the exchange, once serving
        self._remote_ranks: set[int] = set()  # ranks of other nodes, as the exchange told (self._lock)
        if record:
            manifest = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=time.time(),
                                job_id=job_id, world_size=0, ddptop_version=__version__,
                                hosts=[self.host], note="black box of `ddptop launch`")
            try:
                self.recording = JobRecording(jobrecord.job_dir(job_id, create=True), manifest, cap_bytes)
            except (OSError, DdptopError) as exc:  # a full or read-only disk: watch without recording
                self.record.record_note = f"no recording: {exc}"
                log.warning("ddptop agent: %s", self.record.record_note)
        # The agent reads a rank's last words as soon as its connection closes (a clean exit
        # closes it while the process still finalizes, maybe for seconds): the record must never
        # say "lost" for a rank that said goodbye. The exit itself comes later, from the pidfd.
        self._live = LiveSource(JobTarget(job_id=job_id, world_size=0, endpoints=[]), token=auth.load_token(),
                                read_stuck=False)
        self._write_record()

    @property
    def ranks_seen(self) -> int:
        """Ranks that announced themselves so far."""
        return len(self._known)

    @property
    def ranks_running(self) -> int:
        """Ranks whose process has not ended yet."""
        with self._lock:
            return self._exits.watching

    def serve_metrics(self, listen: tuple[str, int]) -> str:
        """Serve Prometheus metrics on *listen* until :meth:`finish`; the URL (OSError if unbindable)."""
        from ddptop.agent.metrics import JobCollector, registry_for
        from ddptop.agent.metrics_http import MetricsServer

        server = MetricsServer(registry_for(JobCollector(self.metrics_view)), listen)
        self._metrics = server
        with self._lock:
            self.record.metrics_url = server.url
            self._write_record()
        return server.url

    def serve(self, bind: str, token: str | None, port: int = 0) -> int:
        """Serve this node's ranks to viewers on *bind* (the node's one endpoint, see
        :mod:`ddptop.agent.endpoint`) until :meth:`finish`; the port (OSError if unbindable)."""
        from ddptop.agent.endpoint import NodeEndpoint

        self._endpoint = NodeEndpoint(bind, port, token, self.job_id, self._catch_up, self._ask,
                                      news_catch_up=self._news.catch_up)
        self._news.serve(self._endpoint, token)
        return self._endpoint.port

    def metrics_view(self, now: float) -> AgentView:
        """One consistent read of the model for a scrape: this node's ranks only."""
        from ddptop.agent.metrics import AgentView

        with self._lock:
            snapshot = self.model.snapshot(now)
            histories = self.model.histories()
            record_bytes = self.recording.bytes_on_disk if self.recording is not None else 0
            local = set(self.model.ranks) - self._remote_ranks
        return AgentView.local(self.job_id, self.host, snapshot, histories, record_bytes, local)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Begin discovering, subscribing and watching (returns at once)."""
        self._live.start(self._event)
        self._thread = threading.Thread(target=self._run, name="ddptop-agent", daemon=True)
        self._thread.start()

    def finish(self, exit_code: int | None, grace_s: float = 5.0) -> JobRecord:
        """The command ended: wait (bounded) for the ranks' exits, close the record."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._exits.watching == 0:
                    break
            time.sleep(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=grace_s)
        self._scan()  # a rank that announced itself at the very end
        for gone in self._exits.poll(0):
            self._on_exit(gone)
        # The job ended here; the other nodes may still be telling how it ended there (or be
        # found lost): bounded, and at once when every other rank's ending is known.
        self.record.exchange = self._news.finish(sorted(self._known))
        self._live.stop()
        self._outside.close()
        self._exits.close()
        if self._endpoint is not None:  # after the last exits went out to the viewers
            self._endpoint.close()
        if self._metrics is not None:
            self._metrics.close()
            self.record.metrics_url = ""  # served while the job ran; nobody answers there now
        with self._lock:
            self.record.end_time = time.time()
            self.record.exit_code = exit_code
            for outcome in self.record.ranks:
                if outcome.status in (Status.RUNNING, Status.STARTING):
                    outcome.status = "lost"  # it never reported an end before the command ended
            if self.recording is not None:
                try:
                    self.recording.close(f"command exited with {exit_code}")
                except Exception as exc:
                    self.record.record_errors += 1
                    log.warning("ddptop agent: closing the recording failed: %s", exc)
            self._write_record()
        return self.record

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_scan:
                    self._scan()
                    next_scan = time.monotonic() + SCAN_S
                for gone in self._exits.poll(SCAN_S / 2):
                    self._on_exit(gone)
                self._read_silent_ranks()
                if self.recording is not None:
                    try:
                        self.recording.flush_if_due()
                    except Exception as exc:
                        self._record_failed(exc)
                with self._lock:
                    steps = self.model.steps(self._known)
                self._news.beat(steps)
                if time.monotonic() - self._record_written >= RECORD_EVERY_S:
                    with self._lock:
                        self._write_record()
            except Exception as exc:  # the agent must outlive anything a rank leaves behind
                log.warning("ddptop agent: %s", exc)
                self._stop.wait(0.1)

    def _scan(self) -> None:
        new: list[Endpoint] = []
        for endpoint in discovery.jobs_on_host(include_stale=True).get(self.job_id, []):
            known = self._known.get(endpoint.rank)
            if known is not None and (known.pid, known.agent_port) == (endpoint.pid, endpoint.agent_port):
                continue
            self._known[endpoint.rank] = endpoint
            self._news.rank_found(endpoint)  # again once it names this agent (install() spawned it)
            if known is not None and known.pid == endpoint.pid:
                continue
            new.append(endpoint)
            with self._lock:
                self._exits.watch(endpoint.rank, endpoint.pid)
                self._memory.watch(endpoint.rank, endpoint.pid)
                self._scheduler.watch(endpoint.rank, endpoint.pid, rank_environ(endpoint.pid))
                self._silence.forget(endpoint.rank)  # a new incarnation is judged afresh
                self.record.world_size = max(self.record.world_size, endpoint.world_size)
                self.record.ranks = [o for o in self.record.ranks if o.rank != endpoint.rank]
                self.record.ranks.append(RankOutcome(rank=endpoint.rank, pid=endpoint.pid))
                self.record.ranks.sort(key=lambda o: o.rank)
        if new:
            self._live.add_endpoints(new)

    def _event(self, event: Frame) -> None:
        # From the live source's thread, and from ours for exits and last words.
        if (isinstance(event, RecordEntry) and isinstance(event.message, StateMsg)
                and event.message.state.status in FINAL and not event.message.state.worker_crashes):
            # Last words, whichever path brought them: with the rank's dead workers attached.
            state = event.message.state
            state.worker_crashes = remains.worker_crashes(self.job_id, event.rank, state)
        self._record(event)
        if isinstance(event, RecordEntry | RankExit):
            # Not its connections: how a rank ended is the agent's to see, from its exit.
            with self._lock:
                self.model.apply(event)
                if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
                    self._heard(event.rank, event.time, event.message.state.status in FINAL)
        if self._endpoint is not None and isinstance(event, RecordEntry | RankExit | ConnectionEvent):
            self._endpoint.publish(event)

    def _catch_up(self) -> list[Event]:
        """Everything known about each local rank now: what a viewer that connects gets first."""
        with self._lock:
            return model_catch_up(self.model, set(self.model.ranks) - self._remote_ranks, time.time())

    def _ask(self, command: str, timeout: float) -> list[Event]:
        """Stacks or FR dumps of every local rank that still runs (see :func:`ask_ranks`)."""
        with self._lock:
            local = set(self.model.ranks) - self._remote_ranks
        return ask_ranks(self._live, self.model, self._lock, local, command, timeout)

    # ------------------------------------------------------------ stacks from outside

    def _heard(self, rank: int, at: float, final: bool) -> None:
        # Under self._lock. A rank that answers again loses its .stuck file.
        if final:
            self._silence.forget(rank)
        else:
            self._silence.heard(rank, at)
        if rank in self._stuck:
            self._stuck.discard(rank)
            self._outside.answered(rank)
            discovery.record_path(self.job_id, rank, "stuck").unlink(missing_ok=True)

    def _read_silent_ranks(self) -> None:
        """Ask the outside reader (its own thread, rate-limited) about every silent rank."""
        with self._lock:
            silent = self._silence.silent(time.time())
        for rank, since in silent:
            endpoint = self._known.get(rank)
            if endpoint is not None and discovery.pid_alive(endpoint.pid):
                self._outside.request(rank, endpoint.pid, since,
                                      discovery.record_path(self.job_id, rank, "crash"))

    def _on_stuck(self, report: StuckReport) -> None:
        # On the outside reader's thread: publish for viewers here, then into the black box.
        with self._lock:
            endpoint = self._known.get(report.rank)
            if endpoint is None or endpoint.pid != report.pid or report.rank not in {
                    r for r, _ in self._silence.silent(time.time())}:
                return  # it answered (or ended) while it was being read
            self._stuck.add(report.rank)
            try:
                discovery.private_write(discovery.record_path(self.job_id, report.rank, "stuck"),
                                        msgspec.msgpack.encode(report))
            except OSError as exc:
                log.warning("ddptop agent: cannot write rank %d's stuck report: %s", report.rank, exc)
        stacks = StacksMsg.of_stuck(report)
        self._event(RecordEntry(time=report.time, rank=report.rank, message=stacks))
        self._news.tell(RecordEntry(time=report.time, rank=report.rank, message=news_stacks(stacks)))

    def _record(self, event: Frame) -> None:
        if self.recording is not None:
            try:
                self.recording.write(event)
            except Exception as exc:  # a full disk must not stop the watching
                self._record_failed(exc)

    def _record_failed(self, exc: Exception) -> None:
        with self._lock:
            self.record.record_errors += 1
            if self.record.record_errors == 1:  # once: a full disk fails every second after
                self.record.record_note = f"recording failed: {exc}"
                log.warning("ddptop agent: recording failed: %s (what was recorded stays readable)", exc)

    def _on_exit(self, gone: ProcessExit) -> None:
        endpoint = self._known.get(gone.key)
        if endpoint is None or endpoint.pid != gone.pid:
            return  # a previous incarnation of a restarted rank
        with self._lock:
            self._heard(gone.key, gone.time, final=True)
            view = self.model.ranks.get(gone.key)
            seen = view.state if view is not None else None
        state = remains.read_final_state(self.job_id, gone.key, gone.pid, seen)
        if state is not None and state is not seen:
            self._event(RecordEntry(time=gone.time, rank=gone.key, message=StateMsg(state=state)))
        self._record_crash_file(gone.key)
        oom = self._memory.verdict(gone.key, gone.pid, gone.signal)
        cause = oom.cause or self._scheduler.verdict(gone.key, gone.pid, gone.signal)
        exit_event = RankExit(time=gone.time, rank=gone.key, pid=gone.pid, host=endpoint.node or self.host,
                              exit_code=gone.exit_code, signal=gone.signal, cause=cause,
                              memory_limit_bytes=oom.limit_bytes, memory_peak_bytes=oom.peak_bytes)
        self._event(exit_event)
        with self._lock:
            view = self.model.ranks.get(gone.key)
            last = view.state if view is not None else None
            reason = state.exit_reason if state is not None else ""
            self.record.rank_ended(gone.key, gone.pid, gone.exit_code, gone.signal, gone.time, reason,
                                   self.model.statuses(time.time()))
            self._write_record()
        if last is not None:  # its last word, or its last sample: the step it died at
            last_words = StateMsg(state=news_state(last))
            self._news.tell(RecordEntry(time=last.time, rank=gone.key, message=last_words))
        self._news.tell(exit_event)

    def _remote(self, event: Frame) -> None:
        """What another node's agent told (its ranks' endings, stuck reports, a lost node) and
        where ranks run: into the black box and the model, never to this node's viewers."""
        self._record(event)
        with self._lock:
            if isinstance(event, HostFacts):
                self.model.places.update((r, (event.host, event.facts[ADDRESS_FACT])) for r in event.ranks)
            elif isinstance(event, RecordEntry | RankExit):
                self._remote_ranks.add(event.rank)
                self.model.apply(event)
                self.record.world_size = max(self.record.world_size, self.model.world_size)

    def _record_crash_file(self, rank: int) -> None:
        path = discovery.record_path(self.job_id, rank, "crash")
        text, _cut = read_text_tail(path, MAX_CRASH_READ)
        if has_stacks(text):
            self._event(crash_frame(rank, path.name, text, MAX_CRASH_READ))

    def _write_record(self) -> None:
        self.record.exchange = self._news.summary()
        if self.recording is not None:
            self.record.record_bytes = self.recording.bytes_on_disk
        try:
            jobrecord.write_record(self.record)
        except (OSError, DdptopError) as exc:
            if not self._record_warned:
                log.warning("ddptop agent: cannot write the job record: %s", exc)
            self._record_warned = True
        self._record_written = time.monotonic()

