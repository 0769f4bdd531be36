"""F5 of the failure catalog: an unseeded train/test split desyncs the job at checkpoint save.

How it is planted. Every rank builds the same corpus of 200 "documents" with heavy-tailed
token counts (``torch.manual_seed(0)`` makes them identical everywhere, like a dataset on
disk). Then it does what ``train_test_split(test_size=0.2)`` without ``seed=`` does: it
shuffles with NumPy's global RNG (``np.random.permutation``), which ``torch.manual_seed``
does not seed, so every rank draws its own split. The training documents are concatenated
and cut into fixed-size blocks (the ``group_texts`` packing of LLM fine-tuning recipes),
so the number of blocks, and with it ``len(loader)`` of a DistributedSampler, depends on
which documents the split drew. The rank with the fewest batches finishes its epoch first
and "saves a checkpoint", an ``all_gather`` of its flattened parameters, while the others
are still in DDP's gradient all-reduce of the same sequence number: a collective mismatch.

How deterministic. The tail of the token counts is heavy (Pareto, alpha 1), so whether a
few long documents land in the test split moves the block count a lot: with 4 ranks the
batches per epoch are ~60 (std ~7), and all four ranks drawing the same count has a
probability of about 5e-4 (2 ranks: about 6%). Simulated over 4000 draws with the
constants below; set PROBE_SPLIT_SEED to seed NumPy (the fix) and see the counts agree.

What ddptop must show. ``batches_per_epoch`` differs across ranks from the first batch on
(every rank's ``len(loader)`` is known at ``iter(loader)``), hours before the hang in a
real job; at the end of the shortest epoch the ranks' pending ops at the same seq differ
(``all_gather`` on the short rank(s), ``allreduce`` elsewhere). The process group timeout
is small (PROBE_PG_TIMEOUT, default 30 s), so the job ends by itself with a gloo/NCCL
timeout error instead of hanging for 10 minutes, and PROBE_SECONDS bounds everything else.

Run: ``torchrun --standalone --nproc-per-node 4 probes/unseeded_split.py`` (the probe runs this
script, which ships in the package for ``ddptop demo``).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddptop._demo.train_common import (
    deadline,
    setup,
    small_model,
    step_sleep,
    stop_together,
    train_step,
    wrap_ddp,
)

DOCS = 200
TEST_SIZE = 40  # train_test_split(test_size=0.2)
BATCH = 8
TARGET_BATCHES = 60  # mean batches per epoch per rank: a few seconds per epoch


class PackedBlocks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed-size blocks of the concatenated training documents (features derived from the index)."""

    def __init__(self, blocks: int) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.tensor(i % 10)


def corpus_tokens() -> np.ndarray:
    """Token count of each document: identical on every rank (torch is seeded)."""
    u = torch.rand(DOCS, dtype=torch.float64)
    return np.minimum(u.pow(-1.0).numpy() * 100, 1e7).astype(np.int64)


def block_size(tokens: np.ndarray, world: int) -> int:
    """Block size chosen so that an average split gives ~TARGET_BATCHES batches per rank."""
    mean_train = tokens.sum() * (DOCS - TEST_SIZE) / DOCS
    return max(1, int(mean_train / (TARGET_BATCHES * world * BATCH)))


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    torch.manual_seed(0)  # seeds torch only: NumPy's global RNG stays seeded from the OS
    if os.environ.get("PROBE_SPLIT_SEED"):
        np.random.seed(int(os.environ["PROBE_SPLIT_SEED"]))  # the fix, for comparison
    tokens = corpus_tokens()
    order = np.random.permutation(DOCS)  # the unseeded split
    train_docs = order[TEST_SIZE:]
    blocks = int(tokens[train_docs].sum()) // block_size(tokens, world)
    data = PackedBlocks(blocks)
    sampler = DistributedSampler(data, seed=0)  # seeded, but over a dataset each rank sees differently
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    print(f"rank {rank}: {blocks} blocks, {len(loader)} batches per epoch "
          f"(expected {math.ceil(math.ceil(blocks / world) / BATCH)})", flush=True)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = deadline()
    pause = step_sleep()
    epoch = 0
    stop = False
    while not stop:
        sampler.set_epoch(epoch)
        for x, y in loader:
            train_step(model, opt, x, y, device)  # DDP's all-reduce: the collective the longer ranks sit in
            time.sleep(pause)
            stop = stop_together(end, device)  # every rank stops after the same step
            if stop:
                break
        # "Save a checkpoint": gather every rank's state. The rank that ran out of batches
        # first gets here while its peers are still inside a training all-reduce.
        state = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
        gathered = [torch.empty_like(state) for _ in range(world)]
        # The wall time lets a test measure how soon ddptop names the mismatch.
        print(f"rank {rank}: epoch {epoch} done after {len(loader)} batches; saving at t={time.time():.3f}",
              flush=True)
        dist.all_gather(gathered, state)
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
