"""A model's shared copy taken a slice of ranks at a time, so that the UI thread that takes it
can handle a key between two slices.

The dashboard diagnoses a big job on a background thread, over a copy of the model of the
moment (:meth:`~ddptop.model.job.JobModel.shared_copy`): new views, shared histories. At
32,768 ranks that copy took the UI thread 30 ms, and 50-110 ms with the young collections its
65,536 new objects set off, every few seconds: a key pressed then waited for all of it.

:class:`SlicedCopy` copies :data:`SLICE_RANKS` views per :meth:`~SlicedCopy.step`; the caller
(the dashboard) lets its other work run between steps. Ranks change meanwhile: the copy
watches the model's changes from its first step (a dirty set, as the status index does) and
its last step copies again every view changed since, and the ranks that appeared. The result
is the model as it is at the last step, equal to ``shared_copy()`` taken then
(tests/test_sliced_copy.py): one moment, not a mixture of slices.

Pure: no clock, no threads; called on the thread that applies events to the model.
"""

from __future__ import annotations

from ddptop.model.job import JobModel, view_copy
from ddptop.model.rank_view import RankView

# Views copied per step: ~1 ms at 0.4 us a view, and a young collection now and then (the
# collector's threshold is 50,000 allocations, ddptop.client.collector).
SLICE_RANKS = 2048


class SlicedCopy:
    """``model.shared_copy()``, a slice per :meth:`step` (see the module doc). Not reusable:
    one copy, then :meth:`step` returns it; :meth:`cancel` stops watching the model."""

    def __init__(self, model: JobModel, slice_ranks: int = SLICE_RANKS) -> None:
        self.model = model
        self._slice = max(1, slice_ranks)
        self._todo = list(model.ranks)  # the ranks of the first step, in the model's order
        self._at = 0
        self._views: dict[int, RankView] = {}
        self._world_size = model.world_size
        self._changed = model.watch_dirty()  # ranks changed after their slice was copied
        self.steps = 0

    @property
    def watching(self) -> bool:
        """Whether the copy still watches its model (not yet finished nor cancelled)."""
        return any(sink is self._changed for sink in self.model.dirty_sinks)

    def step(self) -> JobModel | None:
        """Copy the next slice; after the last slice, the copy (then None again)."""
        if not self.watching:
            return None
        self.steps += 1
        ranks, todo = self.model.ranks, self._todo
        if self._at < len(todo):
            views = self._views
            for rank in todo[self._at:self._at + self._slice]:  # a model never drops a rank
                views[rank] = view_copy(ranks[rank])
            self._at += self._slice
            return None
        return self._finish()

    def cancel(self) -> None:
        """Stop watching the model (a copy no longer wanted: the viewer stopped, say)."""
        self.model.dirty_sinks[:] = [s for s in self.model.dirty_sinks if s is not self._changed]

    def _finish(self) -> JobModel:
        model, views = self.model, self._views
        self.cancel()
        ranks = model.ranks
        new = ranks.keys() - views.keys()  # ranks that appeared since the first step
        if model.world_size != self._world_size:
            # The job grew: every view's history ring was resized (a new deque) without a change
            # of its own. Rare (a first state telling a bigger world): copy them all again.
            redo: set[int] = set(ranks)
        else:
            redo = self._changed | new
        for rank in redo:
            views[rank] = view_copy(ranks[rank])
        if new:
            views = {rank: views[rank] for rank in ranks}  # in the model's order
        return model.with_views(views)
