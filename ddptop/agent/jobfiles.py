"""The node agent's two files of a job: its job record (``job.json``) and its recording.

Both lie in the job's record directory (:func:`ddptop.store.jobrecord.job_dir`). The job
record says what the job is (from the agent) and how its ranks ended (read off the agent's
model at every write, :func:`~ddptop.agent.outcomes.rank_outcomes`); the recording (the black
box, :class:`~ddptop.agent.recording.JobRecording`) takes every frame the agent sees. A full or
read-only disk costs the recording, never the watching: each failed write is counted in the
job record, and the first one said.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ddptop._version import __version__
from ddptop.agent.outcomes import rank_outcomes
from ddptop.agent.recording import JobRecording
from ddptop.bundle.format import SCHEMA_VERSION, Frame, Manifest
from ddptop.errors import DdptopError
from ddptop.model.job import JobModel
from ddptop.store import jobrecord
from ddptop.store.jobrecord import JobRecord

log = logging.getLogger(__name__)


class JobFiles:
    """``job.json`` and the recording of one job on this host (no recording: *cap_bytes* None).

    *lock* is the agent's, which guards its model too: the job record is written from the
    model under it (the caller holds it), and a failed write of the recording is counted
    under it (taken here), whichever thread wrote.
    """

    def __init__(self, job_id: str, host: str, command: list[str], cap_bytes: int | None,
                 lock: threading.Lock) -> None:
        self.record = JobRecord(job_id=job_id, host=host, command=list(command), agent_pid=os.getpid(),
                                start_time=time.time(), ddptop_version=__version__)
        self.written_at = 0.0  # time.monotonic() of the last write of job.json (tried)
        self.recording: JobRecording | None = None
        self._lock = lock
        self._warned = False
        if cap_bytes is None:
            return
        manifest = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=time.time(),
                            job_id=job_id, world_size=0, ddptop_version=__version__,
                            hosts=[host], note="black box of `ddptop launch`")
        try:
            self.recording = JobRecording(jobrecord.job_dir(job_id, create=True), manifest, cap_bytes)
        except (OSError, DdptopError) as exc:  # a full or read-only disk: watch without recording
            self.record.record_note = f"no recording: {exc}"
            log.warning("ddptop agent: %s", self.record.record_note)

    @property
    def recording_bytes(self) -> int:
        """The recording's size on disk (0 without one)."""
        return self.recording.bytes_on_disk if self.recording is not None else 0

    # ------------------------------------------------------------ the recording (any thread)

    def write_recording(self, frame: Frame) -> None:
        """One frame into the recording (a failure is counted: a full disk must not stop the watching)."""
        if self.recording is not None:
            try:
                self.recording.write(frame)
            except Exception as exc:
                self._recording_failed(exc)

    def flush_recording(self) -> None:
        """Flush the recording if a second passed (from the agent's loop: quiet jobs get flushed too)."""
        if self.recording is not None:
            try:
                self.recording.flush_if_due()
            except Exception as exc:
                self._recording_failed(exc)

    def _recording_failed(self, exc: Exception) -> None:
        with self._lock:
            self.record.record_errors += 1
            if self.record.record_errors == 1:  # once: a full disk fails every second after
                self.record.record_note = f"recording failed: {exc}"
                log.warning("ddptop agent: recording failed: %s (what was recorded stays readable)", exc)

    # ------------------------------------------------------------ the job record (under the lock)

    def write_record(self, model: JobModel, local: dict[int, int], exchange: str) -> None:
        """Rewrite ``job.json``, its ranks' outcomes (*local*: rank -> its current pid) read off
        *model* as it is now (a failure is logged once: the watching goes on)."""
        record = self.record
        record.ranks = rank_outcomes(model, local, time.time())
        record.world_size = max(record.world_size, model.world_size)
        record.exchange, record.record_bytes = exchange, self.recording_bytes
        try:
            jobrecord.write_record(record)
        except (OSError, DdptopError) as exc:
            if not self._warned:
                log.warning("ddptop agent: cannot write the job record: %s", exc)
            self._warned = True
        self.written_at = time.monotonic()

    def close(self, exit_code: int | None) -> None:
        """The job ended with *exit_code*: its end into the job record, the recording closed
        (``job.json`` is the caller's to write last)."""
        self.record.end_time = time.time()
        self.record.exit_code = exit_code
        if self.recording is not None:
            try:
                self.recording.close(f"command exited with {exit_code}")
            except Exception as exc:
                self.record.record_errors += 1
                log.warning("ddptop agent: closing the recording failed: %s", exc)
