"""Two ranks all-reduce tensors of different sizes: gloo aborts in C++ (catalog F5's mismatch, at once).

Rank 1 passes 273 elements where rank 0 passes 1. On gloo the rank that receives more than
it expects fails an enforce in a background thread: C++ ``terminate`` prints ``what():
[enforce fail at .../pair.cc] op.preamble.length <= op.nbytes. 276 vs 4`` on stderr, with no
rank prefix, and the process dies of SIGABRT without Python last words. The cause is only
in stderr: ``ddptop launch`` keeps its tail in the job's record. On NCCL the same job hangs.
Run: ``torchrun --nproc-per-node 2 probes/size_mismatch.py``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import setup


def main() -> None:
    rank, _world, device = setup(timeout_s=60)
    t = torch.ones(273 if rank == 1 else 1, device=device)
    print(f"rank {rank}: all_reduce of {t.numel()} elements", flush=True)
    dist.all_reduce(t)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
