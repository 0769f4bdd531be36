"""F2 of the failure catalog: a silent hang at the very first collective.

How it is planted. Every rank initialises the process group and enters its first
collective, an ``all_reduce`` that agrees on the sample count before training (seq 1 of
the default group), except one rank (PROBE_STALL_RANK, default the last rank), which
never gets there: it sleeps, as a rank whose NCCL P2P transport never connects looks
from the outside. Nothing is logged and no error appears until the process-group timeout
(PROBE_PG_TIMEOUT, default 30 s instead of NCCL's 10 minutes) ends the job by itself; the
stalled rank stops sleeping at that timeout plus a margin or at PROBE_SECONDS, whichever
comes first, so nothing can hang.

What ddptop must show. Every rank but the stalled one has a pending ``all_reduce`` at seq
1 that ages with the clock, no rank has completed any collective, and the stalled rank
has no pending op at all: "ranks 0,1,2 have been inside their first collective
(all_reduce, seq 1) for N s; rank 3 never joined". On GPUs the remedy to suggest is
``NCCL_P2P_DISABLE=1``.

Run: ``torchrun --standalone --nproc-per-node 4 probes/first_collective_stall.py``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, step_sleep, stop_together, wrap_ddp


def main() -> None:
    pg_timeout = float(os.environ.get("PROBE_PG_TIMEOUT", "30"))
    rank, world, device = setup(timeout_s=pg_timeout)
    stall_rank = int(os.environ.get("PROBE_STALL_RANK", str(world - 1)))
    end = deadline()
    if rank == stall_rank:
        # Never join: sleep in short slices so the bound (timeout + margin, or the probe's
        # deadline) is honoured; the peers' timeout ends the job before that anyway.
        give_up = min(end, time.monotonic() + pg_timeout + 10)
        while time.monotonic() < give_up:
            time.sleep(0.2)
        print(f"rank {rank}: never joined the first collective; giving up", flush=True)
        sys.exit(3)
    samples = torch.tensor([2048.0], device=device)
    print(f"rank {rank}: entering the first collective (all_reduce, seq 1) at t={time.time():.3f}",
          flush=True)
    dist.all_reduce(samples)  # peers wait here until the process-group timeout
    # Only reached when every rank joined (PROBE_STALL_RANK=-1): a short normal run.
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while not stop_together(end, device):
        loss = model(torch.randn(16, 32, device=device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(step_sleep())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
