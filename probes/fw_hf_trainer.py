"""Hugging Face ``Trainer`` DDP on CPU (gloo) under torchrun: a tiny model, no downloads.

The model is built from a config (GPT-2, one layer, width 16, vocabulary 64;
``HF_HUB_OFFLINE=1``). ``Trainer`` prepares its loaders with accelerate
(``DataLoaderShard`` around a plain DataLoader, sharded per rank, one batch fetched
ahead), trains with ``PROBE_ACCUM`` (2) batches per optimizer step for
``PROBE_EPOCHS`` (2) epochs and evaluates after each epoch. Each rank's dataset holds
``PROBE_TRAIN`` (12) batches of 4 sequences, sharded over the ranks by accelerate (6
per rank with 2 ranks); ``PROBE_UNEQUAL=1`` gives rank 1 a smaller dataset (an
unseeded split: each rank loads a different subset), so its training loader is shorter.
Then the ranks hold until released (``common.hold_until_released``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from common import deadline, hold_until_released
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

BATCH = 4
SEQ = 8


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences; labels are the inputs (causal LM)."""

    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(0, 64, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """A short pause per step so a 2-core machine is not saturated."""

    def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
        time.sleep(float(os.environ.get("PROBE_STEP_SLEEP", "0.01")))


def main() -> None:
    """Train and evaluate, then hold the final numbers until released."""
    end = deadline()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    batches = int(os.environ.get("PROBE_TRAIN", "12"))
    if os.environ.get("PROBE_UNEQUAL") == "1" and rank == 1:
        batches -= 2 * world
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory(prefix="fw-hf-") as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
            gradient_accumulation_steps=int(os.environ.get("PROBE_ACCUM", "2")),
            num_train_epochs=int(os.environ.get("PROBE_EPOCHS", "2")), eval_strategy="epoch",
            save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
            ddp_backend="gloo", ddp_find_unused_parameters=False, dataloader_num_workers=0,
            disable_tqdm=True, seed=0, learning_rate=1e-3,
        )
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(batches * BATCH, rank),
                          eval_dataset=Tokens(3 * BATCH * world, 100), callbacks=[Pace()])
        trainer.train()
    hold_until_released(end)


if __name__ == "__main__":
    main()
