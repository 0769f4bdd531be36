"""Progress counters fed by class-level patches of torch (the reporter's hot path).

Everything here runs on the training thread, once per step or per batch, so each hook
does a couple of ``perf_counter`` reads and attribute stores and nothing else: no
allocation, no locks, no logging. The reporter thread reads the counters and turns
them into rates; a torn read costs one slightly wrong sample, never a crash.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ddptop.protocol import LoaderInfo
from ddptop.reporter import deepspeed_engine, resources
from ddptop.reporter.loaders import LoaderRecord, page_loader, patch_dataloader, role_of
from ddptop.store.progress_page import L_STEPS, LAST_STEP_PC_F, STEP, TRAIN_INDEX, ProgressPage

_perf = time.perf_counter


class Progress:
    """Counters shared between the training thread (writer) and the reporter (reader)."""

    __slots__ = (
        "batch_seq",
        "first_step_pc",
        "hook_errors",
        "last_rec",
        "last_started",
        "last_step_pc",
        "loader_by_id",
        "loaders",
        "loaders_seen",
        "on_epoch_start",
        "on_wrap",
        "optimizer_calls",
        "optimizer_id",
        "page",
        "page_floats",
        "page_ints",
        "saved_to",
        "step",
        "step_batch_seq",
        "train_rec",
        "wait_total",
    )

    def __init__(self) -> None:
        self.step = 0
        self.first_step_pc = 0.0  # perf_counter of the first step
        self.last_step_pc = 0.0  # perf_counter of the latest step
        self.wait_total = 0.0  # time spent inside DataLoader __next__ (s), every loader
        self.loaders: list[LoaderRecord] = []  # replaced, never mutated (the reporter reads it)
        self.loader_by_id: dict[int, LoaderRecord] = {}
        self.loaders_seen = 0
        self.last_rec: LoaderRecord | None = None  # loader of the latest batch, any loader
        self.last_started: LoaderRecord | None = None  # loader of the latest iter()
        self.train_rec: LoaderRecord | None = None  # loader of the batch before the latest step
        self.batch_seq = 0  # batches taken from any loader
        self.saved_to = ""  # directory of the rank's latest torch.save to a path (the checkpoints)
        self.step_batch_seq = 0  # batch_seq at the latest counted step
        self.optimizer_calls = 0  # optimizer.step() calls, counted or not
        self.optimizer_id = 0
        self.hook_errors = 0
        # Where the hooks mirror their counters: private memory until the reporter attaches
        # the rank's page file (:meth:`attach_page`), which outlives the rank.
        self.page = ProgressPage.private()
        self.page_ints = self.page.ints
        self.page_floats = self.page.floats
        # Set by the reporter (reporter/sampler.py): called on the training thread (cold paths only).
        self.on_epoch_start: Callable[[int], None] | None = None
        self.on_wrap: Callable[[str, Any, Any], None] | None = None

    def mark_step(self) -> None:
        """Count one training step (``ddptop.step()``: always counted)."""
        now = _perf()
        if not self.step:
            self.first_step_pc = now
        self.last_step_pc = self.page_floats[LAST_STEP_PC_F] = now
        self.step = self.page_ints[STEP] = self.step + 1
        self.step_batch_seq = self.batch_seq
        if self.last_rec is not None:
            self.train_rec = self.last_rec
            self.page_ints[TRAIN_INDEX] = self.last_rec.index + 1

    def attach_page(self, page: ProgressPage) -> None:
        """Mirror the counters into *page* from now on (and what they hold so far)."""
        page.ints[STEP], page.floats[LAST_STEP_PC_F] = self.step, self.last_step_pc
        page.ints[TRAIN_INDEX] = self.train_rec.index + 1 if self.train_rec is not None else 0
        self.page, self.page_ints, self.page_floats = page, page.ints, page.floats
        for rec in list(self.loaders):
            page_loader(self, rec)

    def detach_page(self) -> None:
        """Back to private memory (a forked child must not write its parent's page)."""
        self.page = ProgressPage.private()
        self.page_ints, self.page_floats = self.page.ints, self.page.floats

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
        return wall_of(self.last_step_pc)


def wall_of(pc: float) -> float:
    """Wall clock of a perf_counter stamp (0.0 for none)."""
    return time.time() - (_perf() - pc) if pc else 0.0


PROGRESS = Progress()


def _optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any, _p: Progress = PROGRESS,
                         _perf: Callable[[], float] = _perf, _id: Callable[[object], int] = id) -> None:
    # Runs after every optimizer.step(): a handful of stores. Defaults bind globals as
    # locals (faster lookups); torch passes only 3 arguments.
    # A step is an optimizer step that follows a new batch: gradient accumulation takes
    # several batches per step, and a second optimizer (a GAN's generator and
    # discriminator) stepping on the same batch is the same training step. Loops that
    # take no batch from a DataLoader count the first optimizer that steps.
    _p.optimizer_calls += 1
    seq = _p.batch_seq
    if seq:
        if seq == _p.step_batch_seq:
            return
        _p.step_batch_seq = seq
        rec = _p.last_rec
        _p.train_rec = rec
        if rec is not None:
            rec.steps = _p.page_ints[rec.base + L_STEPS] = rec.steps + 1
            _p.page_ints[TRAIN_INDEX] = rec.index + 1
    elif _id(optimizer) != _p.optimizer_id:
        if _p.optimizer_id:
            return
        _p.optimizer_id = _id(optimizer)
    now = _perf()
    if not _p.step:
        _p.first_step_pc = now
    _p.last_step_pc = _p.page_floats[LAST_STEP_PC_F] = now  # mirrored: the page outlives the rank
    _p.step = _p.page_ints[STEP] = _p.step + 1


def install_torch_patches(torch_module: Any, teardown_yield_s: float = 0.05) -> list[str]:
    """Patch optimizer, DataLoader, DDP and teardown at class level; return what was patched."""
    patched: list[str] = []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_optimizer_post_hook)
    patched.append("optimizer_step_post_hook")
    patched += patch_dataloader(PROGRESS)
    patched += _patch_grad_scaler()
    patched += _patch_wrappers()
    patched += _patch_teardown(teardown_yield_s)
    patched += _patch_save(torch_module)
    from ddptop.reporter.torch_import import when_imported

    when_imported("torch.distributed.fsdp._fully_shard._fully_shard", patch_fully_shard)
    patched.append("fully_shard(FSDP2)")
    when_imported(deepspeed_engine.ENGINE_MODULE, functools.partial(deepspeed_engine.patch_engine,
                                                                    progress=PROGRESS))
    patched.append("DeepSpeedEngine(when imported)")
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


def _patch_save(torch_module: Any) -> list[str]:
    """Note the directory of each ``torch.save`` to a path: where the rank's checkpoints go,
    whose filesystem the reporter watches filling (a save, not a step: no hot path)."""
    original = getattr(torch_module, "save", None)
    if original is None or getattr(original, "_ddptop_patched", False):
        return []
    p = PROGRESS

    @functools.wraps(original)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, str | os.PathLike):
            return original(obj, f, *args, **kwargs)
        saves = resources.SAVES
        try:
            saves.path = os.path.abspath(os.fspath(f))
            saves.started_at = time.time()
            p.saved_to = os.path.dirname(saves.path)
        except Exception:
            p.hook_errors += 1
        saves.started += 1
        try:
            return original(obj, f, *args, **kwargs)
        finally:
            # Its disk is read at the reporter's next sample, not on the slow cadence: growth
            # in steps is seen step by step (#55). A counter only: the read is not on this thread.
            saves.returned += 1

    save._ddptop_patched = True  # type: ignore[attr-defined]
    torch_module.save = save
    return ["torch.save(checkpoint directory)"]


def _patch_grad_scaler() -> list[str]:
    """Count a step that AMP's ``GradScaler`` skipped (inf/NaN gradients) as a step.

    ``GradScaler.step`` does not call ``optimizer.step()`` when it finds inf or NaN
    gradients, so the post hook never runs; trainers (Lightning, HF) still count that
    iteration as a step, and so does ddptop: when no optimizer step happened inside
    ``scaler.step``, the hook is called for it. Once per step, never per batch.
    """
    from torch.amp import grad_scaler

    cls = grad_scaler.GradScaler
    original = cls.step
    if getattr(original, "_ddptop_patched", False):
        return []
    p = PROGRESS

    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        calls = p.optimizer_calls
        out = original(self, optimizer, *args, **kwargs)
        if p.optimizer_calls == calls:  # skipped: count the iteration all the same
            try:
                _optimizer_post_hook(optimizer, args, kwargs)
            except Exception:
                p.hook_errors += 1
        return out

    step._ddptop_patched = True  # type: ignore[attr-defined]
    cls.step = step
    return ["GradScaler.step(skipped steps)"]


def patch_fully_shard(module: Any) -> None:
    """Fingerprint each module FSDP2's ``fully_shard`` has just sharded.

    Called when ``torch.distributed.fsdp._fully_shard._fully_shard`` is imported (never
    imported by ddptop itself: it costs every rank start-up time). ``fully_shard``
    changes the module in place (no wrapper module is registered, so the registration
    hook of :func:`_patch_wrappers` never sees it) and turns its parameters into
    DTensors inside ``_init_param_group``: wrapping that module-level function catches
    every ``fully_shard`` call however the script imported it. Best effort: a torch
    without that function is left alone.
    """
    original = getattr(module, "_init_param_group", None)
    if original is None or getattr(original, "_ddptop_patched", False):
        return
    p = PROGRESS

    @functools.wraps(original)
    def _init_param_group(state: Any, params: Any, modules: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(state, params, modules, *args, **kwargs)
        if p.on_wrap is not None and modules:
            try:
                p.on_wrap("fully_shard", modules[0], None)
            except Exception:
                p.hook_errors += 1
        return out

    _init_param_group._ddptop_patched = True  # type: ignore[attr-defined]
    module._init_param_group = _init_param_group


def _patch_wrappers() -> list[str]:
    """Fingerprint the module a DDP (or FSDP) wrapper receives, before it verifies it.

    A global module-registration hook, not a wrapper around ``DDP.__init__``: both
    wrappers assign the user's module (``self.module = module``, FSDP's
    ``_fsdp_wrapped_module``) before they verify parameter shapes across ranks, so the
    fingerprint exists even when that verification fails (catalog F1). A public hook
    leaves DDP's own code and frames untouched (see docs/limitations.md for the
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


def loader_info(rec: LoaderRecord, steps_counted: int) -> LoaderInfo:
    """What viewers are told of one DataLoader: its numbers and its iterator's queue."""
    it = rec.iterator() if rec.iterator is not None else None
    ready, workers, pids = loader_queue_depth(it) if it is not None else (None, 0, [])
    return LoaderInfo(
        index=rec.index, name=rec.name, role=role_of(rec, steps_counted), length=rec.length,
        batch=rec.batch, passes=rec.passes, passes_completed=rec.passes_done(), steps=rec.steps,
        batch_size=rec.batch_size, workers=workers, worker_pids=pids, ready_batches=ready,
        last_batch_at=wall_of(rec.last_pc), rebuilt=rec.rebuilt)
