"""Ranks started by ``torch.multiprocessing.spawn``, no launcher: no RANK in their environment.

Each worker calls ``ddptop.install()`` first thing, as the README says, then
``init_process_group(init_method="tcp://127.0.0.1:PROBE_PORT", rank=r, world_size=n)``: the
reporter learns the rank there (#22). Each worker trains PROBE_STEPS steps (default 20), then
holds (``PROBE_RELEASE``, bounded by PROBE_SECONDS) so a test can look at it.
Run: ``PROBE_PORT=29533 python probes/spawned.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import deadline, hold_until_released, small_model, train_step
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

WORLD = int(os.environ.get("PROBE_WORLD", "2"))
STEPS = int(os.environ.get("PROBE_STEPS", "20"))


def worker(rank: int, port: int) -> None:
    import ddptop

    started = ddptop.install()
    print(f"rank {rank}: install() returned {started}", flush=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    end = deadline()
    model = DDP(small_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    n = STEPS * 8
    data = TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    for x, y in DataLoader(data, batch_size=8):
        train_step(model, opt, x, y, torch.device("cpu"))
        time.sleep(0.05)
    print(f"rank {rank}: step {STEPS}: trained", flush=True)
    os.environ["RANK"] = str(rank)  # hold_until_released names its marker by RANK
    hold_until_released(end)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(int(os.environ["PROBE_PORT"]),), nprocs=WORLD)
