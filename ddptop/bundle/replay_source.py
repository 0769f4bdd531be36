"""ReplaySource: a recording or bundle as a :class:`~ddptop.source.ReplayableSource`.

The file is read once; the model is folded once, and a copy of it is kept every
``CHECKPOINT_EVERY`` events, so ``model_at(t)`` costs one copy plus at most that many
events wherever the timeline jumps.
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
from collections.abc import Sequence

from ddptop.bundle.format import Manifest
from ddptop.bundle.reader import Contents, end_time
from ddptop.bundle.record_dir import read_recording
from ddptop.diagnosis import findings_for_model
from ddptop.model.job import JobModel
from ddptop.protocol import Event, FrTraceMsg
from ddptop.source import Emit, Foreground, PulseSink, StacksResult, StatesResult

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 2000
FINDING_SCAN_POINTS = 240  # moments the first-finding search evaluates, at most


class ReplaySource:
    """Replays a file: the app asks for the job at any moment with ``model_at``."""

    live = False

    def __init__(self, path: str | os.PathLike[str] | Contents,
                 checkpoint_every: int = CHECKPOINT_EVERY) -> None:
        # Contents already read: evidence folded from dumps and logs (ddptop.evidence).
        self.contents: Contents = path if isinstance(path, Contents) else read_recording(path)
        self.manifest: Manifest = self.contents.manifest
        self.warnings: list[str] = list(self.contents.warnings)
        self.foreground = Foreground()  # nothing to give way: the app asks model_at itself
        self.description = (f"{self.manifest.kind} of job {self.manifest.job_id} "
                            f"({self.manifest.world_size} ranks) from {self.contents.path.name}")
        events = self.contents.events
        self._times = [e.time for e in events]
        self.start_time: float = self._times[0] if events else self.manifest.created
        self.end_time: float = end_time(self.contents)
        self.position: float = self.end_time
        self._first_finding: float | None = None
        self._first_finding_done = False
        # Checkpoint i holds the model after the first i * every events.
        self._every = max(1, checkpoint_every)
        self._checkpoints: list[JobModel] = []
        was_enabled = gc.isenabled()
        gc.disable()  # as in read_file: many allocations, no cycles
        try:
            self._final = self._fold(events)
        finally:
            if was_enabled:
                gc.enable()

    def _fold(self, events: Sequence[Event]) -> JobModel:
        model = JobModel(job_id=self.manifest.job_id, world_size=self.manifest.world_size)
        self._checkpoints = [model.copy()]
        for i, event in enumerate(events, 1):
            model.apply(event)
            if i % self._every == 0:
                self._checkpoints.append(model.copy())
        return model

    # ------------------------------------------------------------ JobSource

    def start(self, emit: Emit, pulses: PulseSink | None = None) -> None:
        """Nothing streams in replay: the app pulls ``model_at``; kept for the protocol."""
        del emit, pulses  # never called: a replay has no events after the file was read

    def stop(self) -> None:
        """Nothing to release (the file was read whole at open)."""

    def request_stacks(self, ranks: Sequence[int] | None = None, timeout: float = 5.0) -> StacksResult:
        """The last stacks recorded at or before the current position, per rank."""
        model = self.model_at(self.position)
        wanted = sorted(model.ranks) if ranks is None else list(ranks)
        stacks, errors = {}, {}
        for rank in wanted:
            view = model.ranks.get(rank)
            if view is not None and view.stacks is not None:
                stacks[rank] = view.stacks
            else:
                errors[rank] = "no stacks recorded before this moment"
        return StacksResult(stacks, errors)

    def request_fr_traces(self, ranks: Sequence[int] | None = None,
                          timeout: float = 5.0) -> dict[int, FrTraceMsg]:
        """The last Flight Recorder dumps recorded at or before the current position."""
        model = self.model_at(self.position)
        wanted = sorted(model.ranks) if ranks is None else list(ranks)
        out: dict[int, FrTraceMsg] = {}
        for rank in wanted:
            view = model.ranks.get(rank)
            out[rank] = (view.fr_trace if view is not None and view.fr_trace is not None
                         else FrTraceMsg(rank=rank, time=self.position, error="no trace recorded"))
        return out

    def request_states(self, ranks: Sequence[int], timeout: float = 5.0) -> StatesResult:
        """Nothing: a recording holds no state fresher than the one shown at this moment."""
        why = "a recording has nothing fresher than the states it holds"
        return StatesResult({}, {}, dict.fromkeys(ranks, why))

    def on_demand_stale(self, rank: int) -> bool:
        """False: the states shown are all there is (a digest-lane recording's on-demand
        fields are as old as their details, and no rank can be asked again)."""
        return False

    # ------------------------------------------------------------ ReplayableSource

    def seek(self, t: float) -> float:
        """Move the current position (clamped to the file's span); returns it."""
        self.position = min(max(t, self.start_time), self.end_time)
        return self.position

    def model_at(self, t: float) -> JobModel:
        """The job as known at *t* (every event with time <= t); a fresh copy each call."""
        self.seek(t)
        n = bisect.bisect_right(self._times, t)
        if n == len(self._times):
            return self._final.copy()
        index = min(n // self._every, len(self._checkpoints) - 1)
        model = self._checkpoints[index].copy()
        for event in self.contents.events[index * self._every : n]:
            model.apply(event)
        return model

    def event_times(self) -> list[float]:
        """Distinct times at which anything was recorded, ascending."""
        out: list[float] = []
        for t in self._times:
            if not out or t != out[-1]:
                out.append(t)
        return out

    def first_finding_time(self) -> float | None:
        """Earliest moment the diagnosis reports a warning or worse (None if never or unavailable)."""
        if self._first_finding_done:
            return self._first_finding
        position = self.position
        times = self.event_times()
        step = max(1, len(times) // FINDING_SCAN_POINTS)
        result: float | None = None
        try:
            # Coarse pass over evenly spaced moments, then an exact pass over the gap
            # before the first hit, so the answer is exact at bounded cost.
            hit = self._scan(times, range(0, len(times), step))
            if hit is None and times and (len(times) - 1) % step:
                hit = self._scan(times, [len(times) - 1])
            if hit is not None:
                exact = self._scan(times, range(max(0, hit - step + 1), hit + 1))
                result = times[exact if exact is not None else hit]
        except Exception as exc:  # a diagnosis bug must not break replay
            log.warning("diagnosis failed during replay: %s", exc)
        self.position = position
        self._first_finding, self._first_finding_done = result, True
        return result

    def _scan(self, times: list[float], indices: Sequence[int]) -> int | None:
        for i in indices:
            if any(f.at_least("warning") for f in findings_for_model(self.model_at(times[i]), times[i])):
                return i
        return None
