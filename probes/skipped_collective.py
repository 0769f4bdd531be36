"""Catalog F5 at the end, in its smallest form: one rank skips a collective its peers enter.

Every rank trains a small DDP model and all-reduces a metric after each step, except rank
PROBE_SKIP_RANK (default 1), which skips the metric all-reduce once, after
PROBE_SKIP_AT_STEP optimizer steps (default 10): a collective under a rank-dependent
condition. From there the ranks disagree on what collective number N is: the skipping rank
sends its next DDP gradient bucket while its peers send the metric. On gloo a peer notices
the size mismatch and aborts (SIGABRT) within a second, and torchrun tears the rest down:
the rank that dies first is a victim, not the culprit. A post-mortem must name the
skipping rank, from the ranks' last collectives. On NCCL the same job hangs instead.

Run: ``torchrun --standalone --nproc-per-node 4 probes/skipped_collective.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, step_sleep, stop_together, train_step, wrap_ddp


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    skip_rank = int(os.environ.get("PROBE_SKIP_RANK", "1"))
    skip_at = int(os.environ.get("PROBE_SKIP_AT_STEP", "10"))
    torch.manual_seed(0)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end, pause = deadline(), step_sleep()
    step = 0
    while True:
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = train_step(model, opt, x, y, device)
        step += 1
        metric = loss.detach().reshape(1).to(device)
        if rank == skip_rank and step == skip_at:
            print(f"rank {rank}: step {step}: skipping the metric all_reduce at t={time.time():.3f}",
                  flush=True)
        else:
            dist.all_reduce(metric)
        time.sleep(pause)
        if stop_together(end, device):
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
