"""Healthy DDP training: the baseline that must raise no alarm.

Every rank gets the same number of batches (a seeded DistributedSampler), trains a small
MLP with DDP for PROBE_EPOCHS epochs or until PROBE_SECONDS pass, then saves a checkpoint
on rank 0 after a barrier. Run: ``torchrun --nproc-per-node 4 probes/healthy.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, step_sleep, stop_together, train_step, wrap_ddp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    pg_timeout = os.environ.get("PROBE_PG_TIMEOUT")  # a collective waits this long for a vanished peer
    rank, world, device = setup(timeout_s=float(pg_timeout) if pg_timeout else None)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 32), torch.randint(0, 10, (2048,)))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler,
                        num_workers=int(os.environ.get("PROBE_WORKERS", "0")))
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = deadline()
    epochs = int(os.environ.get("PROBE_EPOCHS", "1000"))
    pause = step_sleep()
    stop = False
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            train_step(model, opt, x, y, device)
            time.sleep(pause)
            # Decided together: a rank that stopped on its own clock would leave its peers
            # in an all-reduce it never joins.
            stop = stop_together(end, device)
            if stop:
                break
        if stop:
            break
    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), os.environ.get("PROBE_CKPT", os.devnull))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
