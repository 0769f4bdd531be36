"""Validation loaders of unequal lengths and a metric all-reduce per validation batch (#20).

Every rank trains on the same number of batches, then validates; rank PROBE_ODD_RANK (default
3) has one validation batch more than the others. Its extra metric all-reduce (one float, 4
bytes) meets its peers' next training step (DDP's gradient bucket): on gloo the rank that
receives more than it expects fails an enforce in C++ and dies of SIGABRT, without Python
last words, within a second of its first validation pass, so no 1 Hz sample shows the
validation loader. Only what survives the death tells the step, the loaders and their
lengths. On NCCL the same job hangs until the watchdog fires.

The first PROBE_SLOW_STEPS steps sleep (so the job is seen training), the rest of the epoch
runs at full speed: the step at death is far from the last sample. Each rank prints
``rank R: step N: validating (B batches)`` as its validation begins.
Run: ``torchrun --nproc-per-node 4 probes/unequal_eval.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import setup, small_model, step_sleep, train_step, wrap_ddp
from torch.utils.data import DataLoader, TensorDataset

ODD_RANK = int(os.environ.get("PROBE_ODD_RANK", "3"))
TRAIN_BATCHES = int(os.environ.get("PROBE_TRAIN_BATCHES", "45"))
SLOW_STEPS = int(os.environ.get("PROBE_SLOW_STEPS", "5"))
EVAL_BATCHES = 13
BATCH = 8


def loader(batches: int, seed: int) -> DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    n = batches * BATCH
    data = TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(data, batch_size=BATCH)


def main() -> None:
    rank, _world, device = setup(timeout_s=60)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = loader(TRAIN_BATCHES, 0)
    val = loader(EVAL_BATCHES + (1 if rank == ODD_RANK else 0), 1)
    step = 0
    for epoch in range(2):
        model.train()
        for x, y in train:
            train_step(model, opt, x, y, device)
            step += 1
            if step <= SLOW_STEPS:
                time.sleep(max(step_sleep(), 0.2))
        print(f"rank {rank}: step {step}: validating ({len(val)} batches)", flush=True)
        model.eval()
        correct = torch.zeros(1, device=device)
        with torch.no_grad():
            for x, y in val:
                hits = (model(x.to(device)).argmax(1) == y.to(device)).sum().float().reshape(1)
                dist.all_reduce(hits)  # a metric synced per batch: the collective that desyncs
                correct += hits
        print(f"rank {rank}: epoch {epoch}: accuracy {correct.item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
