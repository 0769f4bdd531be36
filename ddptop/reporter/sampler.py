"""The reporter thread: one daemon thread per rank that samples, remembers and serves.

The thread wakes once per interval (1 s by default), turns the hot-path counters of
:mod:`ddptop.reporter.progress` into a :class:`RankState`, appends a compact sample to
a bounded history, pushes the state to subscribed viewers and answers requests in
between. Every failure is caught and counted in ``RankState.reporter``; training never
sees one.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

import msgspec

from ddptop.net.server import ReporterServer
from ddptop.protocol import (
    ErrorMsg,
    FrTraceMsg,
    HistoryMsg,
    Message,
    RankState,
    ReporterStats,
    Request,
    Sample,
    StacksMsg,
    StateMsg,
)
from ddptop.reporter import collectives, deepspeed_engine, environment, stacks
from ddptop.reporter.config import ReporterConfig
from ddptop.reporter.crash import CrashCapture
from ddptop.reporter.enqueue_timer import next_sample_at
from ddptop.reporter.last_words import SigtermWatch
from ddptop.reporter.loaders import LoaderRecord, choose_training
from ddptop.reporter.progress import PROGRESS, Progress, loader_info, wall_of
from ddptop.reporter.resources import ResourceReader
from ddptop.reporter.store_publish import Announcer, own_endpoint
from ddptop.reporter.system import SystemSampler
from ddptop.reporter.where import sample_where
from ddptop.secrets_filter import mask_value
from ddptop.status import Status
from ddptop.store import discovery, job_token
from ddptop.store.progress_page import ProgressPage

log = logging.getLogger(__name__)

LOADERS_GONE_SHOWN = 4  # loaders no longer referenced that RankState.loaders still lists
# Samples not counted in ReporterStats.longest_sample_s: the first ones read versions, the
# environment and the groups' members once, before training has settled.
WARMUP_SAMPLES = 5


class Reporter:
    """State, history and server of one rank."""

    def __init__(self, config: ReporterConfig, progress: Progress = PROGRESS) -> None:
        self.config = config
        self.progress = progress
        self.stats = ReporterStats()
        self.history: deque[Sample] = deque(maxlen=config.history_len)
        self.collectives = collectives.CollectiveTracker(
            fr_after_s=config.fr_after_s, timing_every_s=config.fr_timing_every_s,
            on_error=self._count_error)
        self.system = SystemSampler()
        self.resources = ResourceReader(config.checkpoint_dir)
        self.crash = CrashCapture(discovery.rank_file(config.job_id, config.rank, "crash"))
        self.state = RankState(
            rank=config.rank, local_rank=config.local_rank, world_size=config.world_size,
            host=socket.gethostname(), pid=os.getpid(), job_id=config.job_id,
            status=Status.STARTING, start_time=time.time(), restart_count=config.restart_count,
        )
        self._stop = threading.Event()
        # Held by whoever samples: the reporter thread, or the last words on another thread.
        self._sample_lock = threading.Lock()
        self._last_words_written = False
        self.sigterm: SigtermWatch | None = None
        self._thread: threading.Thread | None = None
        self.server: ReporterServer | None = None
        self.announcer: Announcer | None = None
        self._last_wait = 0.0
        self._last_step_time = 0.0
        self._last_steps = 0
        self._torch_ready = False
        self._train_loader: LoaderRecord | None = None
        self._loader_steps: dict[int, int] = {}
        progress.on_epoch_start = self._on_epoch_start
        progress.on_wrap = self._on_wrap

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind the server, write the discovery entry and start the thread."""
        cfg = self.config
        # Enforced here, in the rank, not only by `ddptop launch --bind`: DDPTOP_BIND can be
        # set by hand, and an open port without a token must never be served.
        try:
            token = job_token.for_serving(cfg.bind, cfg.job_id, cfg.token, make=True)
        except OSError as exc:  # a read-only runtime dir: still served, on loopback only
            self._count_error(exc)
            token = None
        self.server = ReporterServer(cfg.bind, cfg.port, token, cfg.rank, cfg.job_id, self.handle)
        self.state.crash_file = str(self.crash.path) if self.crash.enable() else ""
        self.crash.watch_exit()
        self._attach_page()
        self.sigterm = SigtermWatch(self._on_sigterm, self.crash.file)
        self.sigterm.install()
        endpoint = own_endpoint(cfg, self.server.port, self.state.start_time, self.state.host)
        self.announcer = Announcer(endpoint, cfg.store_timeout_s)
        atexit.register(self.shutdown)
        self._thread = threading.Thread(target=self._run, name="ddptop-reporter", daemon=True)
        self._thread.start()

    def _attach_page(self) -> None:
        """The progress page the node agent reads after a death no last words follow."""
        path = discovery.rank_file(self.config.job_id, self.config.rank, "page")
        try:
            page = ProgressPage.create(path, self.config.rank, time.time() - time.perf_counter())
        except (OSError, ValueError) as exc:  # the counters stay in private memory
            self._count_error(exc)
            return
        self.progress.attach_page(page)
        os.register_at_fork(after_in_child=self.progress.detach_page)

    def shutdown(self) -> None:
        """Stop the thread, leave last words, remove the discovery entry."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.collectives.close()
        if self.server is not None:
            self.server.wake()  # the thread may sit in a poll of up to one interval
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        reason = self.crash.exception_reason()
        asked = self.crash.exit_request
        if not reason and asked is not None:
            # sys.exit on the main thread: its status (a message exits 1) is the rank's own word
            self.state.exit_code = asked.status
            self.last_words(Status.CRASHED if asked.status else Status.EXITED, asked.reason)
        else:
            self.last_words(Status.CRASHED if reason else Status.EXITED, reason)
        try:
            discovery.rank_file(self.config.job_id, self.config.rank).unlink(missing_ok=True)
        except OSError as exc:
            log.debug("ddptop: discovery entry not removed: %s", exc)
        if self.server is not None:
            self.server.close()

    def _on_sigterm(self) -> None:
        # On the SIGTERM thread (or the main thread's handler): the rank is about to die.
        self.last_words(Status.TERMINATED, "terminated by SIGTERM")

    def last_words(self, status: str, reason: str) -> None:
        """Write the final state (a fresh sample and fresh FR ops) to ``<job>.<rank>.last``.

        Called at exit and on SIGTERM, possibly while the reporter thread samples: the
        sample lock is waited for briefly, and without it the last sample taken stands.
        Never raises. The first call wins: SIGTERM's words are not overwritten at exit.
        """
        if self._last_words_written:
            return
        locked = self._sample_lock.acquire(timeout=0.5)
        try:
            if self._last_words_written:
                return
            if locked:
                try:  # at exit torch may be half torn down: the words matter more than the sample
                    self.sample()
                    self._add_recent_ops()
                except Exception as exc:
                    self._count_error(exc)
            self.state.status = status
            self.state.exit_reason = mask_value(reason)  # an exception may quote a secret
            path = discovery.rank_file(self.config.job_id, self.config.rank, "last")
            # Atomic, 0600, never through a link: a reader never sees half a file.
            discovery.private_write(path, msgspec.msgpack.encode(self.state))
            self._last_words_written = True
        except Exception as exc:
            log.debug("ddptop: last words incomplete: %s", exc)
        finally:
            if locked:
                self._sample_lock.release()

    def _add_recent_ops(self) -> None:
        if not self._torch_ready or not self.state.collectives:
            return
        try:
            recent = collectives.recent_ops(collectives.decode_fr(
                collectives.read_fr_json(backend=self.collectives.backend)))
        except Exception as exc:
            self._count_error(exc)
            return
        for group in self.state.collectives:
            group.recent = recent.get(group.pg, [])
            if group.recent:  # after destroy_process_group c10d is gone, FR still knows the last seq
                group.seq = max(group.seq, group.recent[-1].seq)

    def _run(self) -> None:
        interval = self.config.interval_s
        next_sample = time.monotonic()
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_sample:
                    with self._sample_lock:
                        self.sample()
                    next_sample = next_sample_at(interval)
                    assert self.server is not None
                    self.server.broadcast(StateMsg(state=self.state))
                assert self.server is not None
                self.server.poll(max(0.0, min(interval, next_sample - time.monotonic())))
            except Exception as exc:  # count, remember, carry on
                self._count_error(exc)
                self._stop.wait(0.05)

    def _count_error(self, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = mask_value(f"{type(exc).__name__}: {exc}"[:300])
        if self.stats.errors <= 3:
            log.warning("ddptop reporter error (counted, training unaffected): %s", exc)

    # ------------------------------------------------------------ sampling

    def sample(self) -> RankState:
        """Refresh ``self.state`` from counters, c10d and the system; record history."""
        t_cpu = time.thread_time()
        now = time.time()
        s, p = self.state, self.progress
        s.time = now
        # Each part on its own: one that fails (a psutil or NVML error, a torch internal that
        # moved) is counted and the rest of the state still goes out; the rank stays visible.
        self._part(self._sample_progress, s, p)
        torch = sys.modules.get("torch")
        full_reads = self.collectives.full_reads
        if torch is not None and self._torch_ready:
            self._part(self._sample_torch, s, now)
        self._part(self._sample_system, s)
        # The slow reads of the limits wait for a sample that read no full Flight Recorder dump:
        # the longest sample stays what it was.
        self._part(self.resources.fill, s, self.progress.saved_to,
                   self.collectives.full_reads == full_reads, self._torch_ready)
        self._part(sample_where, s, now)  # only while it makes no step: in-process, no signal
        if s.status == Status.STARTING and (p.step or p.batch_seq or s.collectives):
            s.status = "running"
        self.stats.samples += 1
        self.stats.clients = self.server.client_count if self.server else 0
        self.stats.dropped = self.server.counters.dropped_frames if self.server else 0
        if self.server is not None:
            self.server.fill_stats(self.stats)
        self.stats.errors += p.hook_errors
        p.hook_errors = 0
        self.stats.sample_cost_s = time.thread_time() - t_cpu
        if self.stats.samples > WARMUP_SAMPLES:
            self.stats.longest_sample_s = max(self.stats.longest_sample_s, self.stats.sample_cost_s)
        self.stats.fr_full_reads = self.collectives.full_reads
        timer = self.collectives.timer
        self.stats.timing_bursts = timer.bursts if timer is not None else 0
        s.reporter = self.stats
        self.history.append(Sample.of(s, now))
        return s

    def _part(self, part: Any, *args: Any) -> None:
        try:
            part(*args)
        except Exception as exc:
            self._count_error(exc)

    def _sample_system(self, s: RankState) -> None:
        for key, value in self.system.process().items():
            setattr(s, key, value)
        s.shm_used_bytes, s.shm_total_bytes = self.system.shm()
        s.gpu = self.system.gpu()

    def _sample_progress(self, s: RankState, p: Progress) -> None:
        steps, step_time, wait = p.step, p.step_time_total, p.wait_total
        # n steps span n-1 intervals: the first step has nothing to be timed against.
        d_intervals = max(0, steps - 1) - max(0, self._last_steps - 1)
        d_time = step_time - self._last_step_time
        d_wait = wait - self._last_wait
        if d_intervals > 0 and d_time > 0:
            s.step_time_s = d_time / d_intervals
            s.data_wait_fraction = min(1.0, d_wait / d_time)
        self._last_steps, self._last_step_time, self._last_wait = steps, step_time, wait
        s.step, s.last_step_at = steps, p.last_step_at
        records = list(p.loaders)  # the training thread replaces the list, never mutates it
        train = choose_training(records, self._loader_steps, self._train_loader, p)
        self._train_loader = train
        self._loader_steps = {id(r): r.steps for r in records}
        # Loaders that are gone keep their final numbers on show, the latest few only (an
        # evaluation loader built per evaluation would otherwise fill the list).
        gone = [r for r in records if r is not train and not r.alive][-LOADERS_GONE_SHOWN:]
        s.loaders = [loader_info(r, steps) for r in records
                     if r.alive or r is train or r in gone]
        if train is None:
            s.epoch, s.batch, s.batches_per_epoch, s.last_batch_at = 0, 0, None, 0.0
            return
        s.epoch, s.batch, s.batches_per_epoch = train.epoch(), train.batch, train.length
        s.last_batch_at = wall_of(train.last_pc)  # converted from the hot path's perf_counter stamp
        info = next((i for i in s.loaders if i.index == train.index), None)
        if info is not None and train.iterator is not None and train.iterator() is not None:
            # The training loader's iterator: its workers are the ones whose crash the
            # job feels (loader_worker_pids attributes DataLoader worker deaths). Kept as
            # they were once the iterator is gone.
            s.loader_ready_batches, s.loader_workers = info.ready_batches, info.workers
            s.loader_worker_pids = list(info.worker_pids)

    def _sample_torch(self, s: RankState, now: float) -> None:
        from torch.distributed import distributed_c10d as c10d

        if s.versions.torch is None:
            s.versions = environment.versions(self.system.driver_version())
            s.env = environment.reported_env()
        if s.versions.nccl is None and s.versions.cuda:
            # Asked only once the program initialised CUDA itself (never by the reporter).
            s.versions.nccl = environment.nccl_version(sys.modules["torch"])
        ready = c10d.is_initialized()
        if self.announcer is not None:
            self.announcer.tick(group_ready=ready)
        if not ready:
            return
        s.collectives = self.collectives.groups(c10d, now)
        s.backend = self.collectives.backend
        if s.gpu is not None and s.versions.driver is None:
            s.versions.driver = s.gpu.driver

    # ------------------------------------------------------------ training-thread callbacks

    def torch_imported(self, torch_module: Any) -> None:
        """Called once torch is importable: patch its classes (on the importing thread)."""
        from ddptop.reporter.progress import install_torch_patches

        install_torch_patches(torch_module, self.config.teardown_yield_s)
        self.crash.keep_faulthandler_in_workers()
        self._torch_ready = True

    def _on_epoch_start(self, epoch: int) -> None:
        try:
            self.state.rng_fingerprint = environment.rng_fingerprint(epoch)
        except Exception as exc:
            self._count_error(exc)

    def _on_wrap(self, wrapper: str, module: Any, device_ids: Any) -> None:
        try:
            if wrapper == deepspeed_engine.WRAPPER:
                fingerprint = deepspeed_engine.fingerprint(module)
            else:
                fingerprint = environment.param_fingerprint(wrapper, module)
            before = self.state.param_fingerprint
            if wrapper == "fully_shard" and before is not None and before.wrapper == wrapper \
                    and before.count > fingerprint.count:
                return  # fully_shard runs per layer, then on the root: keep the whole model
            self.state.param_fingerprint = fingerprint
            if device_ids:
                first = device_ids[0]
                self.system.device_hint = first if isinstance(first, int) else getattr(first, "index", None)
            else:
                # The wrapped module's parameters sit on the rank's device.
                param = next(iter(module.parameters()), None)
                device = getattr(param, "device", None)
                if device is not None and device.type == "cuda" and device.index is not None:
                    self.system.device_hint = int(device.index)
        except Exception as exc:
            self._count_error(exc)

    # ------------------------------------------------------------ requests

    def handle(self, request: Request) -> Message:
        """Answer one read-only viewer request."""
        cmd = request.command
        if cmd in ("state", "subscribe"):
            return StateMsg(state=self.state, id=request.id)
        if cmd == "history":
            return HistoryMsg(rank=self.config.rank, samples=list(self.history), id=request.id)
        if cmd == "stacks":
            return StacksMsg(rank=self.config.rank, time=time.time(),
                             threads=stacks.all_thread_stacks(), id=request.id)
        if cmd == "fr_trace":
            try:
                text = collectives.read_fr_json(backend=self.collectives.backend) if self._torch_ready else ""
                # FR strings (frames, group descriptions) leave the host: the env's filter.
                return FrTraceMsg(rank=self.config.rank, time=time.time(), json=mask_value(text),
                                  error="" if text else "Flight Recorder unavailable",
                                  id=request.id)
            except Exception as exc:
                return FrTraceMsg(rank=self.config.rank, time=time.time(), error=mask_value(str(exc)),
                                  id=request.id)
        return ErrorMsg(reason=f"unsupported request {cmd!r}", id=request.id)
