"""F1 of the failure catalog: one rank builds a different model before DDP construction.

How it is planted. Every rank builds a speaker-embedding model (an ``embedding`` table of
PROBE_EMBED_ROWS x 192, default 5994 rows like VoxCeleb2's speakers, then a small head),
except rank PROBE_BAD_RANK (default 2, or the last rank of a smaller job), whose speaker
list came out empty, as with a data-preparation step that failed on one node: its table is
``[0, 192]``. The parameter count is the same everywhere; one shape differs. DDP's
constructor checks shapes across ranks (``_verify_param_shape_across_processes``) and
fails with the catalog's "size of tensor a (192) must match the size of tensor b (0)"
kind of error, or, depending on the torch version and backend, while broadcasting the
parameters. The process-group timeout is small (PROBE_PG_TIMEOUT, default 30 s) so that a
version that hangs there instead ends by itself too.

Before failing, each rank stays up for PROBE_LINGER seconds (default 5) after the error:
a real job's ranks die within a second of the error, before a person can attach, and the
linger models a viewer that was already watching; ddptop takes the fingerprint of the
module handed to DDP before DDP verifies it, so it knows every rank's parameter shapes.

What ddptop must show. ``param_fingerprint`` differs on the bad rank: same count, another
``shapes_hash``, and the first differing parameter named: "rank 2: embedding.weight is
[0, 192], others [5994, 192]".

Run: ``torchrun --standalone --nproc-per-node 4 probes/param_mismatch.py``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.distributed as dist
from common import setup
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

EMBED_DIM = 192


class SpeakerModel(nn.Module):
    """An embedding table of speakers and a small projection head."""

    def __init__(self, speakers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(speakers, EMBED_DIM)
        self.head = nn.Linear(EMBED_DIM, 64)


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    bad_rank = int(os.environ.get("PROBE_BAD_RANK", str(min(2, world - 1))))
    rows = int(os.environ.get("PROBE_EMBED_ROWS", "5994"))
    speakers = 0 if rank == bad_rank else rows  # the empty speaker list on one rank
    model = SpeakerModel(speakers).to(device)
    print(f"rank {rank}: wrapping a model with {speakers} speakers in DDP at t={time.time():.3f}", flush=True)
    try:
        DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    except Exception as exc:
        print(f"rank {rank}: DDP construction failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        time.sleep(float(os.environ.get("PROBE_LINGER", "5")))
        traceback.print_exc()
        sys.exit(1)
    # Verification passed here (the check raises on the rank that differs only); the
    # peers then wait for the bad rank, which never joins, and fail when it is gone.
    print(f"rank {rank}: DDP construction passed here; waiting for the other ranks", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
