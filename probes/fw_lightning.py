"""PyTorch Lightning DDP on CPU (gloo), as a new user writes it, under torchrun.

Lightning runs a sanity check on the validation loader first (the loader the reporter
used to mistake for the training loader), then trains with gradient accumulation
(``PROBE_ACCUM``, default 2) for ``PROBE_EPOCHS`` epochs (2) and validates after each.
Each rank gets its own shard (``use_distributed_sampler=False``, like a pre-split
dataset): ``PROBE_TRAIN`` batches of 4 (6) in the training loader, 4 in the validation
loader; ``PROBE_UNEQUAL=1`` gives rank 1 two training batches fewer (the planted split).
Then the ranks hold until released (``common.hold_until_released``).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning as L
import torch
from common import deadline, hold_until_released, small_model
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH = 4


class Classifier(L.LightningModule):
    """The probes' small MLP as a LightningModule."""

    def __init__(self) -> None:
        super().__init__()
        self.net = small_model()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.01")))
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def shard(batches: int, seed: int) -> TensorDataset:
    """*batches* batches of random samples, different on every rank."""
    gen = torch.Generator().manual_seed(seed)
    n = batches * BATCH
    return TensorDataset(torch.randn(n, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen))


def main() -> None:
    """Fit, then hold the final numbers until released."""
    end = deadline()
    rank = int(os.environ["RANK"])
    train_batches = int(os.environ.get("PROBE_TRAIN", "6"))
    if os.environ.get("PROBE_UNEQUAL") == "1" and rank == 1:
        train_batches -= 2
    train = DataLoader(shard(train_batches, rank), batch_size=BATCH)
    val = DataLoader(shard(4, 100 + rank), batch_size=BATCH)
    trainer = L.Trainer(
        accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp",
        max_epochs=int(os.environ.get("PROBE_EPOCHS", "2")),
        accumulate_grad_batches=int(os.environ.get("PROBE_ACCUM", "2")),
        use_distributed_sampler=False, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        max_time={"seconds": max(1, int(end - time.monotonic()))},
    )
    trainer.fit(Classifier(), train_dataloaders=train, val_dataloaders=val)
    hold_until_released(end)


if __name__ == "__main__":
    main()
