"""A recorded job served as a live one: the dashboard's live screens over fixed, real data.

A live job cannot be pictured twice alike (times, pids, stuck ages and batch counts change
from run to run), so the snapshot tests replay what ``ddptop export`` collected from a real
job: its file is read by the product's own reader, its events go to the app through the
ordinary JobSource interface, and a stacks request is answered with the stacks the export
took. The app runs in live mode (table, stacks key) with its clock frozen at the moment
the export was written, so every age it shows is the age it had then.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ddptop.bundle.reader import build_model, end_time
from ddptop.bundle.record_dir import read_recording
from ddptop.model.job import JobModel
from ddptop.protocol import FrTraceMsg
from ddptop.source import Emit, Foreground, PulseSink, StacksResult, StatesResult


class RecordedJob:
    """A live :class:`~ddptop.source.JobSource` whose ranks say what a recording holds."""

    live = True

    def __init__(self, path: Path) -> None:
        self.contents = read_recording(path)
        self.foreground = Foreground()
        self.description = f"job {self.contents.manifest.job_id} as recorded in {path.name}"
        self.now = end_time(self.contents)  # the app's clock: the moment of the export
        self._final: JobModel = build_model(self.contents)
        self.stopped = False

    def clock(self) -> float:
        """The frozen "now" to pass to the app."""
        return self.now

    def start(self, emit: Emit, pulses: PulseSink | None = None) -> None:
        """Deliver the whole recording before returning, unlike a real job's thread.

        The app then folds it in one batch, so its first redraw with rows is already the
        final picture: a snapshot must not depend on how a thread's events were batched
        (findings are recomputed at most once a second, on whatever had arrived by then).
        """
        for event in self.contents.events:
            emit(event)

    def stop(self) -> None:
        """Nothing runs; remember that the app stopped us."""
        self.stopped = True

    def request_stacks(self, ranks: Sequence[int] | None = None, timeout: float = 5.0) -> StacksResult:
        """The stacks the export took; a rank without one is an error, as from a live job."""
        wanted = sorted(self._final.ranks) if ranks is None else list(ranks)
        stacks = {r: v.stacks for r in wanted
                  if (v := self._final.ranks.get(r)) is not None and v.stacks is not None}
        return StacksResult(stacks, {r: "no stacks recorded" for r in wanted if r not in stacks})

    def request_states(self, ranks: Sequence[int], timeout: float = 5.0) -> StatesResult:
        """None: a recording has nothing fresher than the states it holds."""
        return StatesResult({}, {}, dict.fromkeys(ranks, "not available here"))

    def on_demand_stale(self, rank: int) -> bool:
        """Every state it emits is whole: nothing to fetch."""
        return False

    def request_fr_traces(self, ranks: Sequence[int] | None = None,
                          timeout: float = 5.0) -> dict[int, FrTraceMsg]:
        """The Flight Recorder dumps the export took."""
        wanted = sorted(self._final.ranks) if ranks is None else list(ranks)
        return {r: v.fr_trace for r in wanted
                if (v := self._final.ranks.get(r)) is not None and v.fr_trace is not None}
