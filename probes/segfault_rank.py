"""F4 of the failure catalog: one rank dies of SIGSEGV in the middle of training.

How it is planted. A healthy DDP loop (seeded DistributedSampler, small MLP) runs on every
rank; after PROBE_CRASH_AFTER_STEPS optimizer steps (default 20) rank PROBE_CRASH_RANK
(default 1) reads address 0 through ``ctypes.string_at(0)``, a real invalid memory access
in native code, like a faulty CUDA/cuDNN kernel or driver build would make. The kernel
sends SIGSEGV; no Python exception, no atexit handler runs. Its peers are left in the
next all-reduce until torchrun notices the dead child and tears the job down (or the
process-group timeout, PROBE_PG_TIMEOUT, default 30 s, ends them), so the job ends by
itself.

What ddptop must show. The crashed rank first: status ``crashed``, the signal
("Segmentation fault") from its faulthandler crash file, with the Python stack at the
moment of the crash (this file, ``crash()``), while the others were waiting in an
all-reduce at a later seq than the dead rank reached.

Run: ``torchrun --standalone --nproc-per-node 4 probes/segfault_rank.py``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, step_sleep, stop_together, train_step, wrap_ddp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def crash() -> None:
    """Dereference NULL in native code: the process dies of SIGSEGV right here."""
    ctypes.string_at(0)


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    crash_rank = int(os.environ.get("PROBE_CRASH_RANK", "1"))
    crash_after = int(os.environ.get("PROBE_CRASH_AFTER_STEPS", "20"))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = deadline()
    pause = step_sleep()
    step = 0
    epoch = 0
    stop = False
    while not stop:
        sampler.set_epoch(epoch)
        for x, y in loader:
            train_step(model, opt, x, y, device)
            step += 1
            if rank == crash_rank and step == crash_after:
                print(f"rank {rank}: step {step}: reading address 0 (SIGSEGV) at t={time.time():.3f}",
                      flush=True)
                # A real crash strikes anywhere; a pause first lets the reporter sample the
                # crashing step, so a post-mortem test can hold the step it names to it.
                time.sleep(float(os.environ.get("PROBE_CRASH_PAUSE", "0")))
                crash()
            time.sleep(pause)
            stop = stop_together(end, device)
            if stop:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
