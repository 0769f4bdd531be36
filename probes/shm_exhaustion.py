"""DataLoader workers that cannot hand their batches over: /dev/shm too small (catalog F1's shm).

A container started without ``--shm-size`` gets a 64 MB /dev/shm; DataLoader workers put
every batch there. Each rank here loads batches of PROBE_BATCH_MB (default 4) MB with two
workers: run under a small /dev/shm (the test mounts a 2 MB tmpfs in a mount namespace of
its own) the workers fail to write their shared segments and the rank raises torch's
"Caught RuntimeError in DataLoader worker process 0", whose original error at the end is
the cause. Run: ``torchrun --nproc-per-node 2 probes/shm_exhaustion.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import setup
from torch.utils.data import DataLoader, Dataset


class Big(Dataset[torch.Tensor]):
    """Samples of PROBE_BATCH_MB megabytes each."""

    def __init__(self) -> None:
        self.numel = int(float(os.environ.get("PROBE_BATCH_MB", "4")) * (1 << 20)) // 4

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.numel,), float(i))


def main() -> None:
    rank, _world, device = setup()
    loader = DataLoader(Big(), batch_size=1, num_workers=2)
    for step, batch in enumerate(loader, 1):
        total = batch.sum().reshape(1).to(device)
        dist.all_reduce(total)
        if step == 1:
            print(f"rank {rank}: step {step}: first batch at t={time.time():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
