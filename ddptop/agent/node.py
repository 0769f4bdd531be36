"""The node agent: one per job and host, it outlives the ranks and keeps their record.

``ddptop launch`` and ``python -m ddptop.agent`` run it (:mod:`ddptop.agent.launcher`) on a
thread beside the job. It is made of parts, each in its own module:

* **rank watching and exits** (:class:`~ddptop.agent.ranks.LocalRanks`): the job's local ranks,
  found in the runtime directory; when one's process ends, how (exit code or signal, the OOM
  killer's or SLURM's part), its last words and its crash file, before anything is cleaned up;
* **silence and outside reads** (:class:`~ddptop.agent.stuck.StuckWatch`): a rank that stops
  answering is read from outside (py-spy, faulthandler's signal, /proc), and where it is stuck
  is left in ``<job>.<rank>.stuck`` for viewers on this host, and in the black box;
* **the job's outcome** (:mod:`ddptop.agent.outcomes`): ``job.json`` (read by ``jobs``,
  ``doctor``, ``replay``) written from the agent's :class:`~ddptop.model.job.JobModel`, the
  model that every event of the black box (:class:`~ddptop.agent.recording.JobRecording`) is
  folded into: the two cannot disagree on how a rank ended.

Here they are put together: every event, whether a rank sent it (through a ``LiveSource``
subscribed to each rank), the agent saw it or another node's agent told it (the exchange,
:mod:`ddptop.agent.exchange`, driven by :mod:`ddptop.agent.news`), goes into the black box
and the model along one path. The agent
also serves the model to viewers (:mod:`ddptop.agent.endpoint`) and as Prometheus metrics
(:mod:`ddptop.agent.metrics`). Nothing here runs inside a rank: the cost of recording is the
agent's, never training's.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from ddptop import auth
from ddptop._version import __version__
from ddptop.agent.exits import ProcessExit
from ddptop.agent.news import NodeNews
from ddptop.agent.outcomes import JobFile, LostAtFinish
from ddptop.agent.ranks import LocalRanks
from ddptop.agent.recording import JobRecording
from ddptop.agent.serving import ask_ranks, model_catch_up, news_stacks, news_state
from ddptop.agent.stderr_tail import CONSOLE_FILE
from ddptop.agent.stuck import StuckWatch
from ddptop.bundle.format import ADDRESS_FACT, SCHEMA_VERSION, Frame, HostFacts, Manifest
from ddptop.client.live import LiveSource
from ddptop.client.targets import JobTarget
from ddptop.errors import DdptopError
from ddptop.evidence.fold import exit_told
from ddptop.evidence.torchrun_log import read_torchrun_log
from ddptop.model.job import JobModel
from ddptop.protocol import ConnectionEvent, Event, RankExit, RecordEntry, StacksMsg, StateMsg, StuckReport
from ddptop.status import FINAL
from ddptop.store import jobrecord, remains
from ddptop.store.jobrecord import JobRecord

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
        self.model = JobModel(job_id=job_id)  # what the agent knows: endings, last states, stuck reports
        # Guards the model, the job file and the set of remote ranks (the agent's, the live
        # source's, the outside reader's and the endpoint's threads all reach them).
        self._lock = threading.Lock()
        self._file = JobFile(JobRecord(job_id=job_id, host=self.host, command=list(command),
                                       agent_pid=os.getpid(), start_time=time.time(),
                                       ddptop_version=__version__))
        self._ranks = LocalRanks(job_id, self.host)
        self._stuck = StuckWatch(job_id, self._ranks.pid_of, self._on_stuck)
        self._lost = LostAtFinish()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.recording: JobRecording | None = None
        self._metrics: MetricsServer | None = None
        self._endpoint: NodeEndpoint | None = None
        self._news = NodeNews(job_id, self.host, self._remote)  # the exchange, once serving
        self._remote_ranks: set[int] = set()  # ranks of other nodes, as the exchange told
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
        self._write_file()

    @property
    def record(self) -> JobRecord:
        """``job.json`` as last written (its ranks' outcomes read off :attr:`model`)."""
        return self._file.record

    @property
    def ranks_seen(self) -> int:
        """Ranks that announced themselves so far."""
        return len(self._ranks.endpoints)

    @property
    def ranks_running(self) -> int:
        """Ranks whose process has not ended yet."""
        return self._ranks.running

    def serve_metrics(self, listen: tuple[str, int]) -> str:
        """Serve Prometheus metrics on *listen* until :meth:`finish`; the URL (OSError if unbindable)."""
        from ddptop.agent.metrics import JobCollector, registry_for
        from ddptop.agent.metrics_http import MetricsServer

        server = MetricsServer(registry_for(JobCollector(self.metrics_view)), listen)
        self._metrics = server
        with self._lock:
            self.record.metrics_url = server.url
            self._write_file()
        return server.url

    def serve(self, bind: str, token: str | None, port: int = 0) -> int:
        """Serve this node's ranks to viewers on *bind* (the node's one endpoint, see
        :mod:`ddptop.agent.endpoint`) until :meth:`finish`; the port (OSError if unbindable)."""
        from ddptop.agent.endpoint import NodeEndpoint

        self._endpoint = NodeEndpoint(bind, port, token, self.job_id, self._catch_up, self._ask,
                                      news_catch_up=self._news.catch_up, select=self._catch_up,
                                      host=self.host)
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
        while time.monotonic() < deadline and self._ranks.running:
            time.sleep(0.05)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=grace_s)
        self._scan()  # a rank that announced itself at the very end
        for gone in self._ranks.exits(0):
            self._on_exit(gone)
        self._exits_told_by_torchrun()
        # The job ended here; the other nodes may still be telling how it ended there (or be
        # found lost): bounded, and at once when every other rank's ending is known.
        self.record.exchange = self._news.finish(sorted(self._ranks.endpoints))
        self._live.stop()  # no connection event after this one: the verdicts below are the last word
        with self._lock:
            lost = self._lost.verdicts(self.model, self._ranks.pids(), time.time())
        for verdict in lost:  # it never reported an end before the command ended
            self._take(verdict)
        self._stuck.close()
        self._ranks.close()
        if self._endpoint is not None:  # after the last exits went out to the viewers
            self._endpoint.close()
        if self._metrics is not None:
            self._metrics.close()
            self.record.metrics_url = ""  # served while the job ran; nobody answers there now
        with self._lock:
            self.record.end_time = time.time()
            self.record.exit_code = exit_code
            if self.recording is not None:
                try:
                    self.recording.close(f"command exited with {exit_code}")
                except Exception as exc:
                    self.record.record_errors += 1
                    log.warning("ddptop agent: closing the recording failed: %s", exc)
            self._write_file()
        return self.record

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_scan:
                    self._scan()
                    next_scan = time.monotonic() + SCAN_S
                for gone in self._ranks.exits(SCAN_S / 2):
                    self._on_exit(gone)
                self._stuck.read_silent()
                if self.recording is not None:
                    try:
                        self.recording.flush_if_due()
                    except Exception as exc:
                        self._record_failed(exc)
                with self._lock:
                    steps = self.model.steps(self._ranks.endpoints)
                self._news.beat(steps)
                if time.monotonic() - self._file.written_at >= RECORD_EVERY_S:
                    with self._lock:
                        self._write_file()
            except Exception as exc:  # the agent must outlive anything a rank leaves behind
                log.warning("ddptop agent: %s", exc)
                self._stop.wait(0.1)

    def _scan(self) -> None:
        changed, started = self._ranks.scan()
        for endpoint in changed:
            self._news.rank_found(endpoint)  # again once it names this agent (install() spawned it)
        for endpoint in started:
            self._stuck.forget(endpoint.rank)  # a new incarnation is judged afresh
            with self._lock:
                self.record.world_size = max(self.record.world_size, endpoint.world_size)
        if started:
            self._live.add_endpoints(started)

    # ------------------------------------------------------------ the one path of every event

    def _event(self, event: Frame) -> None:
        """What the live source brings (its thread). A rank's connection is not how it ended
        (a clean exit closes it first): that is the agent's to see, from the exit, so
        connection events go into the record and to viewers, not into the model."""
        if isinstance(event, ConnectionEvent):
            self._lost.saw(event)
            self._take(event, into_model=False)
        else:
            self._take(event)

    def _take(self, event: Frame, into_model: bool = True) -> None:
        """One event into the black box, the model and out to this node's viewers: what a rank
        sent, and what the agent saw itself (exits, crash files, stuck reports, its verdicts)."""
        if (isinstance(event, RecordEntry) and isinstance(event.message, StateMsg)
                and event.message.state.status in FINAL and not event.message.state.worker_crashes):
            # Last words, whichever path brought them: with the rank's dead workers attached.
            state = event.message.state
            state.worker_crashes = remains.worker_crashes(self.job_id, event.rank, state)
        self._record(event)
        if into_model and isinstance(event, RecordEntry | RankExit | ConnectionEvent):
            with self._lock:
                self.model.apply(event)
            if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
                self._stuck.heard(event.rank, event.time, event.message.state.status in FINAL)
        if self._endpoint is not None and isinstance(event, RecordEntry | RankExit | ConnectionEvent):
            self._endpoint.publish(event)

    def _catch_up(self, ranks: set[int] | None = None, samples: int | None = None) -> list[Event]:
        """Everything known about each local rank (of *ranks*) now, its last *samples* of
        history: what a viewer that connects gets first, or asks of some ranks."""
        with self._lock:
            local = set(self.model.ranks) - self._remote_ranks
            return model_catch_up(self.model, local if ranks is None else local & ranks, time.time(), samples)

    def _ask(self, command: str, timeout: float) -> list[Event]:
        """Stacks or FR dumps of every local rank that still runs (see :func:`ask_ranks`)."""
        with self._lock:
            local = set(self.model.ranks) - self._remote_ranks
        return ask_ranks(self._live, self.model, self._lock, local, command, timeout)

    def _on_stuck(self, report: StuckReport) -> None:
        # On the outside reader's thread, its .stuck file written: into the black box, and news.
        stacks = StacksMsg.of_stuck(report)
        self._take(RecordEntry(time=report.time, rank=report.rank, message=stacks))
        self._news.tell(RecordEntry(time=report.time, rank=report.rank, message=news_stacks(stacks)))

    def _on_exit(self, gone: ProcessExit) -> None:
        self._stuck.heard(gone.key, gone.time, final=True)
        with self._lock:
            view = self.model.ranks.get(gone.key)
            seen = view.state if view is not None else None
        told: list[Event] = []
        for event in self._ranks.ending(gone, seen):  # its last words, crash file, exit
            self._take(event)
            if isinstance(event, RankExit):
                told.append(event)
        with self._lock:
            view = self.model.ranks.get(gone.key)
            last = view.state if view is not None else None
            self._write_file()
        if last is not None:  # its last word, or its last sample: the step it died at
            last_words = StateMsg(state=news_state(last))
            told.insert(0, RecordEntry(time=last.time, rank=gone.key, message=last_words))
        for news in told:
            self._news.tell(news)

    def _exits_told_by_torchrun(self) -> None:
        """Each exit of this node whose status could not be read (torchrun reaped the process
        before the agent read its zombie), with the status torchrun's failure summary gives
        for the same pid, read from the job's stderr as the record keeps it. The job's end line,
        the viewers, the other nodes and ``job.json`` then say what ``doctor`` reads."""
        with self._lock:
            unknown = {rank: view.exit for rank, view in self.model.ranks.items()
                       if view.exit is not None and rank not in self._remote_ranks
                       and view.exit.exit_code is None and not view.exit.signal}
        console = jobrecord.job_dir(self.job_id) / CONSOLE_FILE
        if not unknown or not console.is_file():
            return
        try:
            failures = read_torchrun_log(console)  # capped: its last MAX_LOG_BYTES
        except DdptopError as exc:
            log.warning("ddptop agent: %s", exc)
            return
        for failure in failures:
            if failure.rank in unknown:
                for told in exit_told(unknown[failure.rank], failure):
                    self._take(told)
                    self._news.tell(told)

    def _remote(self, event: Frame) -> None:
        """What another node's agent told (its ranks' endings, stuck reports, a lost node) and
        where ranks run: into the black box and the model, never to this node's viewers."""
        self._record(event)
        with self._lock:
            if isinstance(event, HostFacts):
                self.model.places.update((r, (event.host, event.facts[ADDRESS_FACT])) for r in event.ranks)
            elif isinstance(event, RecordEntry | RankExit | ConnectionEvent):
                # (a ConnectionEvent: another node's agent unreachable from here, or back)
                self._remote_ranks.add(event.rank)
                self.model.apply(event)

    # ------------------------------------------------------------ the files

    def _record(self, event: Frame) -> None:
        if self.recording is not None:
            try:
                self.recording.write(event)
            except Exception as exc:  # a full disk must not stop the watching
                self._record_failed(exc)

    def _record_failed(self, exc: Exception) -> None:
        with self._lock:
            self._file.recording_failed(exc)

    def _write_file(self) -> None:
        # Under self._lock: job.json, its ranks' outcomes read off the model as it is now.
        record_bytes = self.recording.bytes_on_disk if self.recording is not None else 0
        self._file.write(self.model, self._ranks.pids(), self._news.summary(), record_bytes)
