"""A collective that stays pending: rank 1 arrives late at an all_gather.

Every rank trains PROBE_STEPS DDP steps, then idles without any collective (a rank that is
merely idle must not show a pending op) until the test releases it (``$PROBE_RELEASE``, see
``common.hold_until_released``; without it, at once), then every rank but
rank 1 enters ``all_gather`` while rank 1 sleeps PROBE_HOLD_S seconds first, so the
others wait inside the collective (gloo: ``gloo:all_gather``, nccl: ``nccl:all_gather``).
Ends by itself within PROBE_SECONDS. Run: ``torchrun --nproc-per-node 2 probes/pending_collective.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, hold_until_released, setup, small_model, step_sleep, train_step, wrap_ddp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    end = deadline()
    seconds = float(os.environ.get("PROBE_SECONDS", "60"))
    rank, world, device = setup(timeout_s=seconds + 30)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = int(os.environ.get("PROBE_STEPS", "5"))
    pause = step_sleep()
    for i, (x, y) in enumerate(loader):
        if i >= steps:
            break
        train_step(model, opt, x, y, device)
        time.sleep(pause)
    print(f"rank {rank}: trained {steps} steps, idling", flush=True)
    # Released by the test once it has seen the idle state: an idle window of fixed length
    # could end before a loaded machine's poll looked at it
    hold_until_released(end)
    if rank == 1:
        hold = float(os.environ.get("PROBE_HOLD_S", "3600"))
        time.sleep(max(0.0, min(hold, end - time.monotonic())))
    print(f"rank {rank}: entering all_gather", flush=True)
    mine = torch.full((4,), float(rank), device=device)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine)
    print(f"rank {rank}: all_gather done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
