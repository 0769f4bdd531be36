"""The node agent: one per job and host, it outlives the ranks and keeps their recording and job record.

``ddptop launch`` and ``python -m ddptop.agent`` run it (:mod:`ddptop.agent.launcher`) on a
thread beside the job. Here its parts are put together, each in its own module:

* **rank watching and exits** (:class:`~ddptop.agent.ranks.LocalRanks`): the job's local ranks,
  found in the runtime directory; when one's process ends, how (exit code or signal, the OOM
  killer's or SLURM's part), its last words and its crash file, before anything is cleaned up;
* **silence and outside reads** (:class:`~ddptop.agent.stuck.StuckWatch`): a rank that stops
  answering is read from outside (py-spy, faulthandler's signal, /proc), and where it is stuck
  is left in ``<job>.<rank>.stuck`` for viewers on this host, and in the black box;
* **the job's files** (:class:`~ddptop.agent.jobfiles.JobFiles`): the job record (``job.json``,
  read by ``jobs``, ``doctor``, ``replay``), written from the agent's
  :class:`~ddptop.model.job.JobModel` (:mod:`ddptop.agent.outcomes`), and the recording (the
  black box, :class:`~ddptop.agent.recording.JobRecording`), which gets every event folded into
  that model: the two cannot disagree on how a rank ended;
* **the other nodes** (:class:`~ddptop.agent.news.NodeNews`, driving the exchange of
  :mod:`ddptop.agent.exchange`): this node's endings told to the other nodes' agents, theirs
  heard;
* **serving** (:class:`~ddptop.agent.service.NodeService`): the model to viewers
  (:mod:`ddptop.agent.endpoint`) and as Prometheus metrics (:mod:`ddptop.agent.metrics`).

Every event, whether a rank sent it (through a ``LiveSource`` subscribed to each rank), the
agent saw it or another node's agent told it, goes into the recording and the model along one
path (:meth:`NodeAgent._take`, :meth:`NodeAgent._remote`). Nothing here runs inside a rank: the
cost of recording is the agent's, never training's.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from ddptop import auth
from ddptop.agent.exits import ProcessExit
from ddptop.agent.jobfiles import JobFiles
from ddptop.agent.news import NodeNews
from ddptop.agent.outcomes import LostAtFinish
from ddptop.agent.ranks import LocalRanks
from ddptop.agent.recording import JobRecording
from ddptop.agent.service import NodeService
from ddptop.agent.serving import news_stacks, news_state
from ddptop.agent.stuck import StuckWatch
from ddptop.bundle.format import ADDRESS_FACT, Frame, HostFacts
from ddptop.client.live import LiveSource
from ddptop.client.targets import JobTarget
from ddptop.model.job import JobModel
from ddptop.protocol import ConnectionEvent, Event, RankExit, RecordEntry, StacksMsg, StateMsg, StuckReport
from ddptop.status import FINAL
from ddptop.store import remains
from ddptop.store.jobrecord import JobRecord

log = logging.getLogger(__name__)

SCAN_S = 0.2  # how often the runtime directory is looked at for new ranks
RECORD_EVERY_S = 2.0  # job.json rewrite cadence while nothing ends


class NodeAgent:
    """Records one job on this host until :meth:`finish` is called."""

    def __init__(self, job_id: str, command: list[str], cap_bytes: int, *, record: bool = True) -> None:
        self.job_id = job_id
        self.host = socket.gethostname()
        self.model = JobModel(job_id=job_id)  # what the agent knows: endings, last states, stuck reports
        # Guards the model, the job record and the set of remote ranks (the agent's, the live
        # source's, the outside reader's and the endpoint's threads all reach them).
        self._lock = threading.Lock()
        self._files = JobFiles(job_id, self.host, command, cap_bytes if record else None, self._lock)
        self._ranks = LocalRanks(job_id, self.host)
        self._stuck = StuckWatch(job_id, self._ranks.pid_of, self._on_stuck)
        self._lost = LostAtFinish()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._remote_ranks: set[int] = set()  # ranks of other nodes, as the exchange told
        self._news = NodeNews(job_id, self.host, self._remote)  # the exchange, once serving
        # The agent reads a rank's last words as soon as its connection closes (a clean exit
        # closes it while the process still finalizes, maybe for seconds): the job record must
        # never say "lost" for a rank that said goodbye. The exit itself comes later, from the pidfd.
        self._live = LiveSource(JobTarget(job_id=job_id, world_size=0, endpoints=[]), token=auth.load_token(),
                                read_stuck=False)
        self._service = NodeService(job_id, self.host, self.model, self._lock, self._remote_ranks,
                                    self._live, self._news, self._files)
        self._write_record()

    @property
    def record(self) -> JobRecord:
        """``job.json`` as last written (its ranks' outcomes read off :attr:`model`)."""
        return self._files.record

    @property
    def recording(self) -> JobRecording | None:
        """The black box (None: not recording)."""
        return self._files.recording

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
        url = self._service.serve_metrics(listen)
        with self._lock:
            self.record.metrics_url = url
            self._write_record()
        return url

    def serve(self, bind: str, token: str | None, port: int = 0) -> int:
        """Serve this node's ranks to viewers on *bind* (the node's one endpoint, see
        :mod:`ddptop.agent.endpoint`) until :meth:`finish`; the port (OSError if unbindable)."""
        return self._service.serve(bind, token, port)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Begin discovering, subscribing and watching (returns at once)."""
        self._live.start(self._event)
        self._thread = threading.Thread(target=self._run, name="ddptop-agent", daemon=True)
        self._thread.start()

    def finish(self, exit_code: int | None, grace_s: float = 5.0) -> JobRecord:
        """The command ended: wait (bounded) for the ranks' exits, close the job record."""
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
        self._service.close()  # after the last exits went out to the viewers
        self.record.metrics_url = ""  # served while the job ran; nobody answers there now
        with self._lock:
            self._files.close(exit_code)
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
                for gone in self._ranks.exits(SCAN_S / 2):
                    self._on_exit(gone)
                self._stuck.read_silent()
                self._files.flush_recording()
                with self._lock:
                    steps = self.model.steps(self._ranks.endpoints)
                self._news.beat(steps)
                if time.monotonic() - self._files.written_at >= RECORD_EVERY_S:
                    with self._lock:
                        self._write_record()
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

    def _write_record(self) -> None:
        # Under self._lock: job.json, its ranks' outcomes read off the model as it is now.
        self._files.write_record(self.model, self._ranks.pids(), self._news.summary())

    # ------------------------------------------------------------ the one path of every event

    def _event(self, event: Frame) -> None:
        """What the live source brings (its thread). A rank's connection is not how it ended
        (a clean exit closes it first): that is the agent's to see, from the exit, so
        connection events go into the recording and to viewers, not into the model."""
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
        self._files.write_recording(event)
        if into_model and isinstance(event, RecordEntry | RankExit | ConnectionEvent):
            with self._lock:
                self.model.apply(event)
            if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
                self._stuck.heard(event.rank, event.time, event.message.state.status in FINAL)
        if isinstance(event, RecordEntry | RankExit | ConnectionEvent):
            self._service.publish(event)

    def _remote(self, event: Frame) -> None:
        """What another node's agent told (its ranks' endings, stuck reports, a lost node) and
        where ranks run: into the black box and the model, never to this node's viewers."""
        self._files.write_recording(event)
        with self._lock:
            if isinstance(event, HostFacts):
                self.model.places.update((r, (event.host, event.facts[ADDRESS_FACT])) for r in event.ranks)
            elif isinstance(event, RecordEntry | RankExit | ConnectionEvent):
                # (a ConnectionEvent: another node's agent unreachable from here, or back)
                self._remote_ranks.add(event.rank)
                self.model.apply(event)

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
            self._write_record()
        if last is not None:  # its last word, or its last sample: the step it died at
            last_words = StateMsg(state=news_state(last))
            told.insert(0, RecordEntry(time=last.time, rank=gone.key, message=last_words))
        for news in told:
            self._news.tell(news)

    def _exits_told_by_torchrun(self) -> None:
        """Each exit of this node whose status could not be read, with the status torchrun's
        failure summary gives (:meth:`LocalRanks.told_by_torchrun`): the job's end line, the
        viewers, the other nodes and ``job.json`` then say what ``doctor`` reads."""
        with self._lock:
            unknown = {rank: view.exit for rank, view in self.model.ranks.items()
                       if view.exit is not None and rank not in self._remote_ranks
                       and view.exit.exit_code is None and not view.exit.signal}
        for told in self._ranks.told_by_torchrun(unknown):
            self._take(told)
            self._news.tell(told)
