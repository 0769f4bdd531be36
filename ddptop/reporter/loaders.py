"""Every DataLoader on its own: one record per loader object, fed by class-level patches.

Frameworks wrap loaders (Lightning's combined loaders and sanity-check validation,
accelerate's ``DataLoaderShard``, HF's Trainer), but each of them ends up calling
``torch.utils.data.DataLoader.__iter__`` on a real loader and ``__next__`` on its
iterator: the patches here see every loader whatever wraps it. Which loader is the
*training* loader is decided by the optimizer hook (:mod:`ddptop.reporter.progress`):
the loader whose batch was taken last when an optimizer step happened.

Some loops build a new DataLoader for every pass over the same data: DeepSpeed's engine
loader (``engine.deepspeed_io``) makes one each time it is iterated, and so does a loop that
builds ``DataLoader(ds, shuffle=True)`` inside its epoch loop. A new loader over the same
dataset object whose order of samples comes from the same sampler object, or from a sampler
of the same class once the previous loader is gone, continues that loader's record (see
:func:`continued_record`): its passes are one loader's passes, and the epoch counts them.
Where the script calls its sampler's ``set_epoch``, that number is the epoch.

The ``__next__`` patch runs once per batch on the training thread: a few attribute
stores, no allocation. Records are created on the cold path (``__iter__``) only.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from ddptop.store.progress_page import (
    L_BATCH,
    L_COMPLETED,
    L_LAST_PC_F,
    PAGE_LOADERS,
    ProgressPage,
    loader_base,
)

_perf = time.perf_counter
MAX_LOADERS = 32  # records kept per rank: loaders re-created every epoch must not pile up


class LoaderRecord:
    """Counters of one DataLoader, or of the loaders built anew for each pass over its data
    (written by the training thread)."""

    __slots__ = ("base", "batch", "batch_size", "completed", "completed_pass", "dataset", "index", "iterator",
                 "last_pc", "length", "loader", "loader_id", "name", "order", "order_kind", "passes",
                 "rebuilt", "sampler_epoch", "slot", "steps")

    def __init__(self, index: int, loader: Any) -> None:
        self.index = index  # order of first iteration on this rank: the same on every rank
        self.loader: weakref.ref[Any] = weakref.ref(loader)
        self.loader_id = id(loader)
        self.rebuilt = 0  # new loader objects that took this record over (one per pass: DeepSpeed)
        self.dataset: weakref.ref[Any] | None = None
        self.order: weakref.ref[Any] | None = None
        self.order_kind: tuple[str, str] = ("", "")
        self.batch_size: int | None = None
        self.name = ""
        self._describe(loader)
        self.iterator: weakref.ref[Any] | None = None
        self.length: int | None = None
        self.passes = 0  # iter() calls: passes started
        self.completed = 0  # passes that reached StopIteration
        self.completed_pass = 0  # the pass whose end was counted (StopIteration may repeat)
        self.batch = 0  # batches yielded in the current pass
        self.steps = 0  # optimizer steps this loader's batches fed
        self.last_pc = 0.0  # perf_counter of its latest batch
        # The epoch the script gave its sampler (set_epoch) at the latest pass start; None
        # while it gave none (a sampler still at epoch 0 may never have been told one).
        self.sampler_epoch: int | None = None
        self.slot = index % PAGE_LOADERS  # its record on the progress page (the newest 16 loaders)
        self.base = loader_base(self.slot)

    def _describe(self, loader: Any) -> None:
        dataset = getattr(loader, "dataset", None)
        self.name = f"{type(loader).__name__}({type(dataset).__name__})"
        self.dataset = _weak(dataset)
        order = order_of(loader)
        self.order = _weak(order)
        self.order_kind = (type(loader).__qualname__, type(order).__qualname__)
        size = getattr(loader, "batch_size", None)
        self.batch_size = size if isinstance(size, int) else None

    def take_over(self, loader: Any) -> None:
        """A new loader over this record's data continues its passes (cold path)."""
        self.loader = weakref.ref(loader)
        self.loader_id = id(loader)
        self.rebuilt += 1
        self._describe(loader)

    def continued_by(self, loader: Any) -> bool:
        """Whether *loader* is this record's loader built anew: the same dataset object, its
        order from the same sampler object, or from a sampler of the same class once the
        previous loader is gone (two live loaders over one dataset stay two records)."""
        dataset = getattr(loader, "dataset", None)
        if dataset is None or self.dataset is None or self.dataset() is not dataset:
            return False
        order = order_of(loader)
        if (type(loader).__qualname__, type(order).__qualname__) != self.order_kind:
            return False
        same_sampler = order is not None and self.order is not None and self.order() is order
        return same_sampler or self.loader() is None

    def epoch(self) -> int:
        """The current epoch: the sampler's, where the script set one, else the passes before this one."""
        if self.sampler_epoch is not None:
            return self.sampler_epoch
        return max(self.passes - 1, 0)

    def end_of_pass(self) -> None:
        """StopIteration from this loader's iterator: count the pass once."""
        if self.completed_pass != self.passes:
            self.completed_pass = self.passes
            self.completed += 1

    def passes_done(self) -> int:
        """Passes completed: ended by StopIteration, or yielded ``len(loader)`` batches.

        Trainers that know the length stop there without asking the iterator for more
        (Lightning), so StopIteration alone would miss their passes.
        """
        current = self.completed_pass != self.passes and self.length is not None \
            and self.passes > 0 and self.batch >= self.length
        return self.completed + int(current)

    @property
    def alive(self) -> bool:
        """Whether the loader object still exists."""
        return self.loader() is not None


class ProgressCounters(Protocol):
    """What the loader hooks read and write of the rank's progress counters
    (:class:`ddptop.reporter.progress.Progress`, which owns them and calls in here)."""

    wait_total: float
    loaders: list[LoaderRecord]
    loader_by_id: dict[int, LoaderRecord]
    loaders_seen: int
    last_rec: LoaderRecord | None
    last_started: LoaderRecord | None
    train_rec: LoaderRecord | None
    batch_seq: int
    hook_errors: int
    page: ProgressPage
    page_ints: memoryview[int]
    page_floats: memoryview[float]
    on_epoch_start: Callable[[int], None] | None


def record_for(p: ProgressCounters, loader: Any) -> LoaderRecord:
    """The record of *loader*, created on its first ``iter()`` (cold path)."""
    rec = p.loader_by_id.get(id(loader))
    if rec is not None and rec.loader() is loader:
        return rec
    rec = continued_record(p, loader)
    if rec is not None:
        return rec
    rec = LoaderRecord(p.loaders_seen, loader)
    p.loaders_seen += 1
    if len(p.loaders) >= MAX_LOADERS:
        # Drop dead loaders first (one re-created per epoch), then the oldest non-training one.
        keep = [r for r in p.loaders if r.alive or r is p.train_rec]
        if len(keep) >= MAX_LOADERS:
            victim = next((r for r in keep if r is not p.train_rec), keep[0])
            keep.remove(victim)
        p.loaders = keep
        p.loader_by_id = {k: v for k, v in p.loader_by_id.items() if v in keep}
    p.loaders = [*p.loaders, rec]  # a new list: the reporter thread iterates the old one
    p.loader_by_id[id(loader)] = rec
    return rec


def continued_record(p: ProgressCounters, loader: Any) -> LoaderRecord | None:
    """The record a new *loader* continues (DeepSpeed's loader built anew each pass), taken
    over by it; None for a loader of its own. The newest matching record wins."""
    for rec in reversed(p.loaders):
        if rec.continued_by(loader):
            if p.loader_by_id.get(rec.loader_id) is rec:
                del p.loader_by_id[rec.loader_id]
            rec.take_over(loader)
            p.loader_by_id[id(loader)] = rec
            return rec
    return None


def order_of(loader: Any) -> Any:
    """What decides *loader*'s order of samples: a batch sampler of the script's own
    (DataLoader(batch_sampler=...), accelerate's shards), else its sampler."""
    sampler = getattr(loader, "sampler", None)
    batches = getattr(loader, "batch_sampler", None)
    if batches is not None and getattr(batches, "sampler", None) is not sampler:
        return batches
    return sampler


def sampler_epoch(loader: Any) -> int | None:
    """The epoch *loader*'s sampler holds (``set_epoch`` keeps it in ``epoch``: DistributedSampler
    and kin), None for a sampler without ``set_epoch``."""
    order = order_of(loader)
    for candidate in (order, getattr(order, "sampler", None)):
        epoch = getattr(candidate, "epoch", None)
        if callable(getattr(candidate, "set_epoch", None)) and isinstance(epoch, int) \
                and not isinstance(epoch, bool):
            return epoch
    return None


def _weak(obj: Any) -> weakref.ref[Any] | None:
    """A weak reference to *obj*, None where it takes none (a list as a dataset): never a
    strong one, which would keep a dataset alive."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def patch_dataloader(p: ProgressCounters) -> list[str]:
    """Patch ``DataLoader.__iter__`` and ``_BaseDataLoaderIter.__next__`` at class level."""
    from torch.utils.data import dataloader as dl

    base_iter_cls = dl._BaseDataLoaderIter
    if getattr(base_iter_cls, "_ddptop_patched", False):
        return []
    original_next = base_iter_cls.__next__
    original_iter = dl.DataLoader.__iter__
    base_iter_cls._ddptop_rec = None  # iterators made without DataLoader.__iter__ have none
    base_iter_cls.__next__ = make_next(original_next, p)

    def __iter__(self: Any) -> Any:
        it = original_iter(self)
        try:
            start_pass(p, self, it)
        except Exception:  # never raise into the training loop
            p.hook_errors += 1
        return it

    dl.DataLoader.__iter__ = __iter__
    base_iter_cls._ddptop_patched = True
    return ["DataLoader.__iter__", "_BaseDataLoaderIter.__next__"]


def make_next(original_next: Callable[[Any], Any], p: ProgressCounters) -> Callable[..., Any]:
    """The patched ``__next__`` around *original_next* (also used by the benchmark)."""

    # Defaults bind the closure's names as locals: this runs once per batch.
    def __next__(self: Any, _next: Callable[[Any], Any] = original_next, _p: ProgressCounters = p,
                 _perf: Callable[[], float] = _perf) -> Any:
        t0 = _perf()
        try:
            batch = _next(self)
        except StopIteration:
            _p.wait_total += _perf() - t0
            rec = self._ddptop_rec
            if rec is not None:
                rec.end_of_pass()
                _p.page_ints[rec.base + L_COMPLETED] = rec.completed
            raise
        t1 = _perf()
        _p.wait_total += t1 - t0
        rec = self._ddptop_rec
        if rec is not None:
            # Mirrored into the progress page, which outlives the rank (two stores).
            rec.batch = _p.page_ints[rec.base + L_BATCH] = self._num_yielded
            rec.last_pc = _p.page_floats[rec.base + L_LAST_PC_F] = t1
            _p.last_rec = rec
            _p.batch_seq += 1
        return batch

    return __next__


def start_pass(p: ProgressCounters, loader: Any, it: Any) -> None:
    """A new pass over *loader* begins with iterator *it* (cold path, training thread)."""
    rec = record_for(p, loader)
    rec.iterator = weakref.ref(it)
    it._ddptop_rec = rec
    rec.completed = rec.passes_done()
    rec.completed_pass = rec.passes
    rec.passes += 1
    rec.batch = 0
    told = sampler_epoch(loader)
    if told is not None and (told or rec.sampler_epoch is not None):
        rec.sampler_epoch = told
    try:
        rec.length = len(loader)
    except TypeError:  # IterableDataset without __len__
        rec.length = None
    page_loader(p, rec)
    p.last_started = rec
    # The RNG fingerprint is taken when the training loader starts a pass (before the
    # first step, when no loader has fed a step yet, any loader's pass counts).
    if p.on_epoch_start is not None and (p.train_rec is None or p.train_rec is rec):
        p.on_epoch_start(rec.epoch())


def page_loader(p: ProgressCounters, rec: LoaderRecord) -> None:
    """Write *rec* in full into the progress page (cold path: a pass begins)."""
    p.page.write_loader(rec.slot, rec.index, rec.name, rec.length, rec.passes, rec.completed, rec.batch,
                        rec.steps, rec.batch_size)


def choose_training(records: list[LoaderRecord], steps_before: dict[int, int],
                    previous: LoaderRecord | None, p: ProgressCounters) -> LoaderRecord | None:
    """The training loader for this sample (reporter thread).

    The loader that fed the most optimizer steps since the previous sample; on a tie the
    one that fed the latest step (the hook's ``train_rec``), then the first iterated. With
    no step since the previous sample the previous choice stands, so the choice does not
    flicker while a trainer evaluates. Before the first step, the loader iterated last.
    """
    deltas = {id(r): r.steps - steps_before.get(id(r), 0) for r in records}
    best = max(deltas.values(), default=0)
    if best > 0:
        top = [r for r in records if deltas[id(r)] == best]
        latest = p.train_rec
        return latest if latest in top else min(top, key=lambda r: r.index)
    if previous is not None and previous.steps:
        return previous
    return p.train_rec or p.last_started


def role_of(rec: LoaderRecord, steps_counted: int) -> str:
    """train (fed optimizer steps), eval (fed none while steps were counted) or "" (too early)."""
    if rec.steps:
        return "train"
    return "eval" if steps_counted else ""
