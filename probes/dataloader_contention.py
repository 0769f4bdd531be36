"""F3 of the failure catalog: too many DataLoader workers, data-wait dominates, one rank lags.

How it is planted. Every rank runs a DataLoader over a dataset whose ``__getitem__`` is
slow (PROBE_ITEM_SECONDS per sample, default 4 ms, mostly sleeping so that the probe
stays light on a small CI machine), with PROBE_WORKERS workers per rank (default: the
number of cores, so that ``num_workers x local ranks`` exceeds the cores of the node
whenever more than one rank runs on it) and a large ``prefetch_factor``
(PROBE_PREFETCH, default 64; the catalog's recipe used 250). The workers cannot keep up
with the training step, so each step waits for its batch. Rank PROBE_SLOW_RANK (default 1)
has a slower dataset (PROBE_SLOW_FACTOR, default 3x per item), as the rank whose workers
lose the competition for CPU and PCIe: it falls behind, and the other ranks then wait for
it inside DDP's all-reduce, which is where a real job's watchdog fires 30 minutes later.

What ddptop must show. A high ``data_wait_fraction`` on every rank, highest on the slow
rank, an empty prefetch queue (``loader_ready_batches`` near 0) although many batches may
be prefetched, ``loader_workers`` per rank, and the arithmetic stated outright:
"num_workers x local ranks = 8 > 2 cores". The slow rank is named as the straggler.

The job ends by itself after PROBE_SECONDS (the process-group timeout, PROBE_PG_TIMEOUT,
default 30 s, bounds any hang).

Run: ``torchrun --standalone --nproc-per-node 4 probes/dataloader_contention.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, stop_together, train_step, wrap_ddp
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples that take *item_s* seconds each to "decode" (sleep plus a little compute)."""

    def __init__(self, size: int, item_s: float) -> None:
        self.size = size
        self.item_s = item_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.item_s)  # I/O and decoding: the worker is busy, not the trainer
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.tensor(i % 10)


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    cores = os.cpu_count() or 1
    workers = int(os.environ.get("PROBE_WORKERS", str(max(2, cores))))
    prefetch = int(os.environ.get("PROBE_PREFETCH", "64"))
    item_s = float(os.environ.get("PROBE_ITEM_SECONDS", "0.004"))
    if rank == int(os.environ.get("PROBE_SLOW_RANK", "1")):
        item_s *= float(os.environ.get("PROBE_SLOW_FACTOR", "3"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if rank == 0:
        print(f"num_workers x local ranks = {workers} x {local_world} = {workers * local_world} "
              f"on {cores} cores; prefetch_factor {prefetch}", flush=True)
    torch.manual_seed(0)
    data = SlowDataset(100_000, item_s)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=workers,
                        prefetch_factor=prefetch, persistent_workers=False)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = deadline()
    for x, y in loader:  # one long epoch: the deadline, not the data, ends the run
        train_step(model, opt, x, y, device)
        if stop_together(end, device):
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
