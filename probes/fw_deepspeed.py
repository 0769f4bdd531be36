"""DeepSpeed ZeRO-2 on CPU (``DS_ACCELERATOR=cpu``, gloo), as a new user writes it, under torchrun.

``deepspeed.initialize`` with a config dict (torch's AdamW through ``torch_adam``), ``engine.backward``,
``engine.step``, and the loader from ``engine.deepspeed_io``: a ``DeepSpeedDataLoader`` that
builds a new torch ``DataLoader`` on every pass (over the same dataset and the same
``DistributedSampler``). ``PROBE_TRAIN`` (5) batches of 4 per rank for ``PROBE_EPOCHS`` (3)
epochs, one optimizer step per batch; then the ranks hold until released
(``common.hold_until_released``).

``PROBE_STALL_RANK=R``: after the release, every rank trains one more epoch, and rank R
stops before its first step of it in ``stall_before_step`` (Python, holding nothing) until
``$PROBE_RELEASE.stall`` appears (bounded by PROBE_SECONDS), while its peers wait for it in
ZeRO's gradient reduction. ``PROBE_MISMATCH_RANK=R``: rank R builds a wider model (a planted
parameter mismatch). DeepSpeed's broadcast of the parameters from rank 0 passes on gloo all
the same; the ranks hold right after ``deepspeed.initialize`` until released, and the first
gradient reduction then fails (gloo aborts the ranks). Should ``initialize`` raise, the rank
lingers ``PROBE_LINGER`` seconds before it exits.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
from common import deadline, hold_until_released, small_model
from torch import nn
from torch.utils.data import TensorDataset

BATCH = 4


def stall_before_step(rank: int, end: float) -> None:
    """Where the stalled rank waits: its peers are already in the step's collectives."""
    print(f"rank {rank}: stalling before its step at t={time.time():.3f}", flush=True)
    release = os.environ.get("PROBE_RELEASE", "") + ".stall"
    while not os.path.exists(release) and time.monotonic() < end:
        time.sleep(0.05)  # polling a file: the test's release is the condition


def train_epoch(engine: deepspeed.DeepSpeedEngine, loader: object, rank: int, end: float,
                stall: bool) -> None:
    """One pass over the engine's loader: forward, ``engine.backward``, ``engine.step``."""
    for x, y in loader:  # type: ignore[attr-defined]
        if stall:
            stall_before_step(rank, end)
            stall = False
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.01")))


def main() -> None:
    """Initialise the engine, train, hold; then the planted stall, if asked for."""
    end = deadline()
    deepspeed.init_distributed(dist_backend="gloo",
                               timeout=timedelta(seconds=float(os.environ.get("PROBE_PG_TIMEOUT", "60"))))
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(0)
    wide = os.environ.get("PROBE_MISMATCH_RANK") == str(rank)
    model = small_model(width=80 if wide else 64)
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        # torch's own AdamW: DeepSpeed's CPU Adam would compile another op.
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        # ZeRO-3 (PROBE_ZERO_STAGE=3) partitions every parameter: none is small enough to be kept whole.
        "zero_optimization": {"stage": int(os.environ.get("PROBE_ZERO_STAGE", "2")),
                              "stage3_param_persistence_threshold": 0},
        "steps_per_print": 1_000_000,
    }
    print(f"rank {rank}: initialising DeepSpeed (wide model: {wide}) at t={time.time():.3f}", flush=True)
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
    except Exception as exc:
        print(f"rank {rank}: deepspeed.initialize failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        time.sleep(float(os.environ.get("PROBE_LINGER", "5")))
        traceback.print_exc()
        sys.exit(1)
    if os.environ.get("PROBE_MISMATCH_RANK") is not None:
        # Initialised with a planted mismatch: hold where a viewer looks (DeepSpeed's broadcast
        # of the parameters passed on gloo; the first gradient reduction fails once released).
        hold_until_released(end)
    batches = int(os.environ.get("PROBE_TRAIN", "5"))
    gen = torch.Generator().manual_seed(0)
    n = batches * BATCH * world
    data = TensorDataset(torch.randn(n, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    loader = engine.deepspeed_io(data, num_local_io_workers=int(os.environ.get("PROBE_WORKERS", "0")))
    for _epoch in range(int(os.environ.get("PROBE_EPOCHS", "3"))):
        train_epoch(engine, loader, rank, end, stall=False)
    hold_until_released(end)
    stall_rank = os.environ.get("PROBE_STALL_RANK")
    if stall_rank is not None:
        train_epoch(engine, loader, rank, end, stall=stall_rank == str(rank))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
