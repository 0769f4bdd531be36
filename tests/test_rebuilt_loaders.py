"""A DataLoader built anew for every pass is one loader's passes (#47), without a torchrun job.

The real patches run in a child Python (class-level patches of torch must not leak into the
test process), over real DataLoaders built the ways scripts build them: DeepSpeed's engine
loader (a new DataLoader per pass over one DistributedSampler, the old one still referenced),
a loop that builds ``DataLoader(ds, shuffle=True)`` every epoch, a resumed run that calls
``set_epoch``; and two loaders over one dataset alive at once, or over a list (no weak
reference), which stay records of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("torch")

_LOOPS = r"""
import json, torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from ddptop.reporter.progress import PROGRESS as p, install_torch_patches
install_torch_patches(torch, 0.0)

def train(loader, limit=None):
    for i, _ in enumerate(loader):
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()
        if limit is not None and i + 1 == limit:
            break

def records(since):
    return [[r.index - since, r.passes, r.passes_done(), r.rebuilt, r.epoch(), r.length]
            for r in p.loaders if r.index >= since]

out = {}
data = TensorDataset(torch.randn(40, 4))

# DeepSpeed's engine loader: a new DataLoader per pass, one DistributedSampler; every loader
# kept (a script's list of them): the same sampler object is what ties them.
since, kept = p.loaders_seen, []
sampler = DistributedSampler(data, num_replicas=2, rank=0, seed=0)
for _ in range(3):
    kept.append(DataLoader(data, batch_size=4, sampler=sampler))
    train(kept[-1])
out["deepspeed"] = records(since)

# A loop that builds its loader (and with it a new RandomSampler) every epoch; the second
# epoch is cut short, as a loop with a step budget per epoch does.
since = p.loaders_seen
for epoch in range(3):
    loader = DataLoader(data, batch_size=8, shuffle=True)
    train(loader, limit=2 if epoch == 1 else None)
    del loader
out["shuffled"] = records(since)

# A resumed run: the script tells the sampler the epoch it resumes at.
since = p.loaders_seen
sampler = DistributedSampler(data, num_replicas=2, rank=0, seed=0)
for epoch in (14, 15):
    sampler.set_epoch(epoch)
    train(DataLoader(data, batch_size=4, sampler=sampler))
out["resumed"] = records(since)

# Two loaders over one dataset, both alive (training, and an evaluation on the training data):
# two records, each with its own passes.
since = p.loaders_seen
train_loader, eval_loader = DataLoader(data, batch_size=4), DataLoader(data, batch_size=20)
for _ in range(2):
    train(train_loader)
    for _ in eval_loader:
        pass
out["both_alive"] = records(since)

# A list as the dataset takes no weak reference: never continued (nothing may keep it alive).
since = p.loaders_seen
rows = [torch.randn(4) for _ in range(8)]
for _ in range(2):
    train(DataLoader(rows, batch_size=4))
out["list"] = records(since)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loops() -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _LOOPS], capture_output=True, text=True, timeout=120,
                         env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


# Each record: [index, passes, passes completed, rebuilt, epoch, length].


def test_a_loader_built_per_pass_over_one_sampler_is_one_loader(loops: dict[str, Any]) -> None:
    assert loops["deepspeed"] == [[0, 3, 3, 2, 2, 5]]


def test_a_loader_with_a_new_sampler_continues_once_the_old_one_is_gone(loops: dict[str, Any]) -> None:
    # The cut-short pass still counts as a pass, not as completed.
    assert loops["shuffled"] == [[0, 3, 2, 2, 2, 5]]


def test_the_epoch_a_script_gives_its_sampler_is_the_epoch(loops: dict[str, Any]) -> None:
    assert loops["resumed"] == [[0, 2, 2, 1, 15, 5]]


def test_two_live_loaders_over_one_dataset_stay_two(loops: dict[str, Any]) -> None:
    assert loops["both_alive"] == [[0, 2, 2, 0, 1, 10], [1, 2, 2, 0, 1, 2]]


def test_a_dataset_without_a_weak_reference_is_never_continued(loops: dict[str, Any]) -> None:
    assert loops["list"] == [[0, 1, 1, 0, 0, 2], [1, 1, 1, 0, 0, 2]]
