"""A straggler: one rank is persistently slower than the others.

Not a catalog failure on its own, but the common step before F3's watchdog timeout: a
rank with a slower GPU, a noisy neighbour or a throttled CPU holds every step back.

How it is planted. A healthy DDP loop (seeded DistributedSampler, small MLP, equal batch
counts) runs on every rank; rank PROBE_SLOW_RANK (default 1) sleeps PROBE_EXTRA_SLEEP
seconds (default 0.15) more per step, *before* the backward pass, i.e. in compute, not in
data loading. The other ranks then spend that time waiting inside DDP's all-reduce, so
their step time equals the slow rank's, but their time between a batch and the end of
the forward pass is short. The job ends by itself after PROBE_SECONDS.

What ddptop must show. The slow rank named as the straggler: its own compute time per
step is higher while the others wait for it in the all-reduce (their seq is ahead, or
they sit in a pending all_reduce whenever sampled), and data-wait is low everywhere, so
this is not input-bound.

Run: ``torchrun --standalone --nproc-per-node 4 probes/straggler.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, step_sleep, stop_together, wrap_ddp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    slow_rank = int(os.environ.get("PROBE_SLOW_RANK", "1"))
    extra = float(os.environ.get("PROBE_EXTRA_SLEEP", "0.15")) if rank == slow_rank else 0.0
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8192, 32), torch.randint(0, 10, (8192,)))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = deadline()
    pause = step_sleep()
    epoch = 0
    stop = False
    while not stop:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            time.sleep(extra)  # the slow rank's extra compute; peers wait in backward's all-reduce
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(pause)
            stop = stop_together(end, device)
            if stop:
                break
        epoch += 1
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
