"""FSDP2 (``fully_shard``) on CPU with gloo: DTensor parameters, sharded per rank.

The probes' MLP with an odd width (``PROBE_WIDTH``, 33) so that dim-0 shards differ in
size across ranks (17 and 16 rows): the local shards differ, the global shapes and
placements do not, and ddptop's parameter fingerprint must agree across ranks. Each
layer is sharded, then the root. ``PROBE_TRAIN`` (5) batches of 4 per rank for
``PROBE_EPOCHS`` (2) epochs, one optimizer step per batch; ``PROBE_UNEQUAL=1`` gives
rank 1 two batches fewer. Then the ranks hold until released.

``PROBE_LINGER_RANK=R`` (with ``PROBE_LINGER_AT_STEP``, default 3): rank R lingers in Python
inside its forward pass at that step (a forward pre-hook that sleeps until ``$PROBE_RELEASE``
appears, bounded by PROBE_SECONDS), while its peers wait in FSDP's all_gather for it.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, hold_until_released, small_model
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

BATCH = 4


def main() -> None:
    """Shard, train, then hold the final numbers until released."""
    end = deadline()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = small_model(width=int(os.environ.get("PROBE_WIDTH", "33")))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    steps = [0]
    if os.environ.get("PROBE_LINGER_RANK") == str(rank):
        at = int(os.environ.get("PROBE_LINGER_AT_STEP", "3"))

        def linger_in_forward_hook(module: nn.Module, args: object) -> None:
            if steps[0] == at:
                print(f"rank {rank}: step {at}: lingering in the forward hook", flush=True)
                release = os.environ.get("PROBE_RELEASE", "")
                while not (release and os.path.exists(release)) and time.monotonic() < end:
                    time.sleep(0.05)  # Python, holding nothing: the peers wait in all_gather

        model.register_forward_pre_hook(linger_in_forward_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = int(os.environ.get("PROBE_TRAIN", "5"))
    if os.environ.get("PROBE_UNEQUAL") == "1" and rank == 1:
        batches -= 2
    gen = torch.Generator().manual_seed(rank)
    data = TensorDataset(torch.randn(batches * BATCH, 32, generator=gen),
                         torch.randint(0, 10, (batches * BATCH,), generator=gen))
    loader = DataLoader(data, batch_size=BATCH)
    for _epoch in range(int(os.environ.get("PROBE_EPOCHS", "2"))):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps[0] += 1
            time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.01")))
            if time.monotonic() > end:
                break
    hold_until_released(end)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
