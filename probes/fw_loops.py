"""Plain training loops as people write them: which loader trains, and what a step is.

``PROBE_MODE=accum`` (default): a DDP loop that peeks at its validation loader before
training (a sanity check), then for ``PROBE_EPOCHS`` epochs takes ``PROBE_ACCUM`` batches
per optimizer step (``no_sync`` on all but the last), runs AMP's ``GradScaler`` (one
planted inf loss makes it skip that optimizer step) on a ``torch.compile``d model
(``PROBE_COMPILE=1``, eager backend: Dynamo without a C++ toolchain), and evaluates on the
validation loader after each epoch. ``PROBE_MODE=gan``: two DDP models and two optimizers
(discriminator, then generator) stepping on every batch; a step must not count twice.

Per rank: ``PROBE_TRAIN`` batches of 4 samples in the training loader and 3 in the
validation loader; ``PROBE_UNEQUAL=1`` gives rank 1 two training batches fewer (the
planted unequal split ddptop must flag). Then the ranks hold until released
(``common.hold_until_released``); PROBE_SECONDS bounds it all.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, hold_until_released, setup, small_model, wrap_ddp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH = 4


def loaders(rank: int) -> tuple[DataLoader[tuple[torch.Tensor, ...]], DataLoader[tuple[torch.Tensor, ...]]]:
    """This rank's training and validation loaders (rank-local shards, like a pre-split dataset)."""
    train_batches = int(os.environ.get("PROBE_TRAIN", "10"))
    if os.environ.get("PROBE_UNEQUAL") == "1" and rank == 1:
        train_batches -= 2
    gen = torch.Generator().manual_seed(rank)
    train = TensorDataset(torch.randn(train_batches * BATCH, 32, generator=gen),
                          torch.randint(0, 10, (train_batches * BATCH,), generator=gen))
    val = TensorDataset(torch.randn(3 * BATCH, 32, generator=gen), torch.randint(0, 10, (3 * BATCH,)))
    return DataLoader(train, batch_size=BATCH), DataLoader(val, batch_size=BATCH)


def evaluate(model: nn.Module, val: DataLoader[tuple[torch.Tensor, ...]]) -> None:
    """One pass over the validation loader (no optimizer step)."""
    with torch.no_grad():
        for x, y in val:
            nn.functional.cross_entropy(model(x), y)


def accum_loop(rank: int, end: float) -> None:
    """Gradient accumulation, GradScaler with one skipped step, validation around training."""
    train, val = loaders(rank)
    torch.manual_seed(0)
    model: nn.Module = wrap_ddp(small_model(), torch.device("cpu"))
    if os.environ.get("PROBE_COMPILE") == "1":
        model = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    accum = int(os.environ.get("PROBE_ACCUM", "2"))
    evaluate(model, val)  # peek before training: ddptop must not take this for the training loader
    steps = 0
    for _epoch in range(int(os.environ.get("PROBE_EPOCHS", "3"))):
        for i, (x, y) in enumerate(train):
            last = (i + 1) % accum == 0
            ddp = getattr(model, "_orig_mod", model)
            ctx = ddp.no_sync() if not last else _null()
            with ctx:
                loss = nn.functional.cross_entropy(model(x), y) / accum
                if steps == 1 and not last:
                    loss = loss * float("inf")  # GradScaler must skip the next optimizer step
                scaler.scale(loss).backward()
            if last:
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                steps += 1
            time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.01")))
            if time.monotonic() > end:
                return
        evaluate(model, val)


def gan_loop(rank: int, end: float) -> None:
    """Two models, two optimizers, both stepping on every batch."""
    train, _ = loaders(rank)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    disc = wrap_ddp(nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1)), cpu)
    gen = wrap_ddp(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 32)), cpu)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    bce = nn.functional.binary_cross_entropy_with_logits
    for _epoch in range(int(os.environ.get("PROBE_EPOCHS", "3"))):
        for x, _y in train:
            fake = gen(torch.randn(x.shape[0], 8))
            real, false = torch.ones(x.shape[0], 1), torch.zeros(x.shape[0], 1)
            loss_d = bce(disc(x), real) + bce(disc(fake.detach()), false)
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            loss_g = bce(disc(fake), real)
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.01")))
            if time.monotonic() > end:
                return


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    """Train in the chosen mode, then hold the final numbers until released."""
    end = deadline()
    rank, _world, _device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "60")))
    if os.environ.get("PROBE_MODE", "accum") == "gan":
        gan_loop(rank, end)
    else:
        accum_loop(rank, end)
    hold_until_released(end)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
