"""Progress counters fed by class-level patches of torch (the reporter's hot path).

Everything here runs on the training thread, once per step or per batch, so each hook
does a couple of ``perf_counter`` reads and attribute stores and nothing else: no
allocation, no locks, no logging. The reporter thread reads the counters and turns
them into rates; a torn read costs one slightly wrong sample, never a crash.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_perf = time.perf_counter


class Progress:
    """Counters shared between the training thread (writer) and the reporter (reader)."""

    __slots__ = (
        "batch",
        "batches_per_epoch",
        "epoch",
        "first_step_pc",
        "hook_errors",
        "last_batch_pc",
        "last_step_pc",
        "loader_iter",
        "on_epoch_start",
        "on_wrap",
        "optimizer_id",
        "primary_iter_id",
        "primary_loader_id",
        "step",
        "wait_total",
    )

    def __init__(self) -> None:
        self.step = 0
        self.first_step_pc = 0.0  # perf_counter of the first step
        self.last_step_pc = 0.0  # perf_counter of the latest step
        self.wait_total = 0.0  # time spent inside DataLoader __next__ (s)
        self.last_batch_pc = 0.0  # perf_counter of the latest training batch (0: none yet)
        self.epoch = -1  # -1 until the first epoch starts
        self.batch = 0
        self.batches_per_epoch: int | None = None
        self.loader_iter: weakref.ref[Any] | None = None
        self.primary_loader_id = 0
        self.primary_iter_id = 0
        self.optimizer_id = 0
        self.hook_errors = 0
        # Set by the agent: called on the training thread (cold paths only).
        self.on_epoch_start: Callable[[int], None] | None = None
        self.on_wrap: Callable[[str, Any, Any], None] | None = None

    def mark_step(self) -> None:
        """Count one training step (optimizer hook or ``ddptop.step()``)."""
        now = _perf()
        if not self.step:
            self.first_step_pc = now
        self.last_step_pc = now
        self.step += 1

    # Derived on the reporter thread, so the hot path stores one timestamp per step:
    # the sum of the step intervals is simply last - first, and wall-clock times are
    # converted from perf_counter stamps only when sampled.

    @property
    def step_time_total(self) -> float:
        """Sum of the intervals between counted steps (s)."""
        return self.last_step_pc - self.first_step_pc if self.step > 1 else 0.0

    @property
    def last_step_at(self) -> float:
        """Wall clock of the latest step (0.0 before the first)."""
        return _wall_of(self.last_step_pc)

    @property
    def last_batch_at(self) -> float:
        """Wall clock of the latest training batch (0.0 before the first)."""
        return _wall_of(self.last_batch_pc)


def _wall_of(pc: float) -> float:
    return time.time() - (_perf() - pc) if pc else 0.0


PROGRESS = Progress()


def _optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any, _p: Progress = PROGRESS,
                         _perf: Callable[[], float] = _perf, _id: Callable[[object], int] = id) -> None:
    # Runs after every optimizer.step(): keep it to one clock read and three stores.
    # Defaults bind globals as locals (faster lookups); torch passes only 3 arguments.
    # With several optimizers, count the first one only: a training step calls each once.
    if _id(optimizer) != _p.optimizer_id:
        if _p.optimizer_id:
            return
        _p.optimizer_id = _id(optimizer)
    now = _perf()
    if not _p.step:
        _p.first_step_pc = now
    _p.last_step_pc = now
    _p.step += 1


def install_torch_patches(torch_module: Any, teardown_yield_s: float = 0.05) -> list[str]:
    """Patch optimizer, DataLoader, DDP and teardown at class level; return what was patched."""
    patched: list[str] = []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_optimizer_post_hook)
    patched.append("optimizer_step_post_hook")
    patched += _patch_dataloader()
    patched += _patch_wrappers()
    patched += _patch_teardown(teardown_yield_s)
    return patched


def _patch_teardown(yield_s: float) -> list[str]:
    """Release the GIL for a moment before ``destroy_process_group`` (torch 2.13, gloo).

    Why: in torch 2.13 (since pytorch#173568) every backward stashes a ``contextvars``
    context in thread-local state that each gloo work copies, so the gloo run-loop thread
    needs the GIL to drop the last work of the final backward. If the main thread reaches
    ``~ProcessGroupGloo`` first (it holds the GIL while it joins that thread, typically
    when the DDP model is freed right after ``destroy_process_group``), the process
    deadlocks at exit (upstream pytorch#180700). A short sleep here lets the run-loop
    threads finish first; it costs the job ``yield_s`` once per call, at teardown.
    ``DDPTOP_TEARDOWN_YIELD=0`` turns it off.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    original = getattr(c10d, "destroy_process_group", None)
    if yield_s <= 0 or original is None or getattr(original, "_ddptop_patched", False):
        return []
    pause = yield_s

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        time.sleep(pause)
        return original(*args, **kwargs)

    destroy_process_group._ddptop_patched = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    if getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group
    return ["destroy_process_group(yield)"]


def _patch_dataloader() -> list[str]:
    from torch.utils.data import dataloader as dl

    base_iter_cls = dl._BaseDataLoaderIter
    if getattr(base_iter_cls, "_ddptop_patched", False):
        return []
    original_next = base_iter_cls.__next__
    original_iter = dl.DataLoader.__iter__
    p = PROGRESS

    # Defaults bind the closure's names as locals: this runs once per batch.
    def __next__(self: Any, _next: Any = original_next, _p: Progress = p,
                 _perf: Callable[[], float] = _perf, _id: Callable[[object], int] = id) -> Any:
        t0 = _perf()
        try:
            return _next(self)
        finally:
            t1 = _perf()
            _p.wait_total += t1 - t0
            if _id(self) == _p.primary_iter_id:
                _p.batch = self._num_yielded
                _p.last_batch_pc = t1

    def __iter__(self: Any) -> Any:
        it = original_iter(self)
        try:
            if p.primary_loader_id == 0:
                # The first loader iterated is taken as the training loader.
                p.primary_loader_id = id(self)
            if id(self) == p.primary_loader_id:
                p.primary_iter_id = id(it)
                p.loader_iter = weakref.ref(it)
                p.epoch += 1
                p.batch = 0
                try:
                    p.batches_per_epoch = len(self)
                except TypeError:  # IterableDataset without __len__
                    p.batches_per_epoch = None
                if p.on_epoch_start is not None:
                    p.on_epoch_start(p.epoch)
        except Exception:  # never raise into the training loop
            p.hook_errors += 1
        return it

    base_iter_cls.__next__ = __next__
    dl.DataLoader.__iter__ = __iter__
    base_iter_cls._ddptop_patched = True
    return ["DataLoader.__iter__", "_BaseDataLoaderIter.__next__"]


def _patch_wrappers() -> list[str]:
    """Fingerprint the module a DDP (or FSDP) wrapper receives, before it verifies it.

    A global module-registration hook, not a wrapper around ``DDP.__init__``: both
    wrappers assign the user's module (``self.module = module``, FSDP's
    ``_fsdp_wrapped_module``) before they verify parameter shapes across ranks, so the
    fingerprint exists even when that verification fails (catalog F1). A public hook
    leaves DDP's own code and frames untouched (see README, known limitations, for the
    torch 2.13 gloo teardown deadlock this was investigated against).
    """
    from torch.nn.modules.module import register_module_module_registration_hook
    from torch.nn.parallel import DistributedDataParallel

    p = PROGRESS
    modules = sys.modules

    def on_registration(parent: Any, name: str, submodule: Any) -> None:
        # Runs for every submodule registration while models are built: a name test first,
        # nothing per training step. FSDP is looked up only once the script imported it:
        # importing it here would cost every rank ~0.6 s of start-up (measured, torch 2.13).
        if p.on_wrap is None or submodule is None:
            return
        if name == "module":
            wrappers = [(DistributedDataParallel, "DistributedDataParallel")]
        elif name == "_fsdp_wrapped_module":
            fsdp = getattr(modules.get("torch.distributed.fsdp"), "FullyShardedDataParallel", None)
            wrappers = [(fsdp, "FullyShardedDataParallel")] if fsdp is not None else []
        else:
            return
        for cls, label in wrappers:
            if isinstance(parent, cls):
                try:
                    p.on_wrap(label, submodule, None)
                except Exception:
                    p.hook_errors += 1
                return

    register_module_module_registration_hook(on_registration)
    return ["module_registration_hook(DDP/FSDP)"]


def loader_queue_depth(iterator: Any) -> tuple[int | None, int, list[int]]:
    """Prefetched-but-unconsumed batches, worker count and worker pids of an iterator.

    Multi-worker loaders keep fetched batches in ``_data_queue`` and out-of-order
    arrivals in ``_task_info`` (entries of length 2 hold data). Read from the reporter
    thread without locks: the numbers are advisory.
    """
    workers = list(getattr(iterator, "_workers", []) or [])
    pids = [int(w.pid) for w in workers if getattr(w, "pid", None)]
    queue = getattr(iterator, "_data_queue", None)
    if queue is None:
        return 0, 0, []
    ready = 0
    try:
        ready += int(queue.qsize())
    except (NotImplementedError, OSError, ValueError):
        return None, len(workers), pids
    task_info = getattr(iterator, "_task_info", {})
    try:
        ready += sum(1 for info in list(task_info.values()) if len(info) == 2)
    except RuntimeError:  # dict changed size while we counted
        pass
    return ready, len(workers), pids
