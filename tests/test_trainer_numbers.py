"""Loaders, steps and Flight Recorder reads as trainers use them, without a torchrun job.

The hook checks run the real patches in a child Python (class-level patches of torch
must not leak into the test process); the diagnosis checks use hand-built states; the
Flight Recorder checks drive ``CollectiveTracker`` with a passed-in clock, through a
real gloo group (world size 1) where one can show the point, and through canned FR
dumps where only a hung peer could produce them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from ddptop.diagnosis import diagnose
from ddptop.model.rank_view import RankView
from ddptop.protocol import LoaderInfo
from ddptop.reporter import collectives
from ddptop.tui.screens.detail import detail_text
from tests.test_diagnosis_rules import NOW, kinds, only, rank, samples, snap

torch = pytest.importorskip("torch")

_HOOKS = r"""
import json, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from ddptop.reporter.progress import PROGRESS as p, install_torch_patches
from ddptop.reporter.loaders import choose_training, role_of
install_torch_patches(torch, 0.0)

def loader(batches):
    return DataLoader(TensorDataset(torch.randn(batches * 4, 4)), batch_size=4)

out = {}
train, val = loader(10), loader(3)
gen, disc = nn.Linear(4, 1), nn.Linear(4, 1)
opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for _ in val:  # a sanity check before training
    pass
out["before_step"] = [choose_training(list(p.loaders), {}, None, p).index, p.step]
for epoch in range(2):
    for i, (x,) in enumerate(train):
        loss = gen(x).sum() + disc(x).sum()
        if epoch == 0 and i == 0:
            loss = loss * float("inf")  # GradScaler skips the optimizer steps of this step
        scaler.scale(loss).backward()
        if i % 2 == 1:  # two batches per step, two optimizers per step
            scaler.step(opt_d)
            scaler.step(opt_g)
            scaler.update()
            opt_g.zero_grad(); opt_d.zero_grad()
    for _ in val:
        pass
chosen = choose_training(list(p.loaders), {}, None, p)
out["step"] = p.step
out["records"] = [[r.index, role_of(r, p.step), r.length, r.batch, r.passes, r.passes_done(), r.steps,
                   r is chosen] for r in p.loaders]
# A loop without any DataLoader: the first optimizer counts, a second one does not.
p.batch_seq = p.step_batch_seq = 0
before = p.step
for _ in range(3):
    opt_g.step(); opt_d.step()
out["no_loader_steps"] = p.step - before
print(json.dumps(out))
"""


def test_loaders_and_steps_as_trainers_define_them() -> None:
    """Sanity-check loader first, accumulation, two optimizers, a GradScaler skip: right numbers."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", _HOOKS], capture_output=True, text=True, timeout=120,
                         env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    # Before any step the loader iterated last stands in for the training loader.
    assert out["before_step"] == [0, 0]
    # 2 epochs x 10 batches / 2 per step = 10 steps: the skipped one counts, the second optimizer does not.
    assert out["step"] == 10
    val, train = out["records"]
    assert val == [0, "eval", 3, 3, 3, 3, 0, False]
    assert train == [1, "train", 10, 10, 2, 2, 10, True]
    assert out["no_loader_steps"] == 3


def _fr(enqueued: int, completed: int, entries: list[dict[str, Any]] | None = None) -> str:
    return json.dumps({"pg_status": {"0": {"last_enqueued_collective": str(enqueued),
                                           "last_completed_collective": str(completed)}},
                       "entries": entries or []})


def _entry(seq: int) -> dict[str, Any]:
    return {"record_id": seq, "collective_seq_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"],
            "profiling_name": "gloo:all_reduce", "state": "scheduled", "time_created_ns": 100 * 10**9,
            "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"]}


class _Pg:
    def __init__(self, name: str, seq: int) -> None:
        self.group_name, self.group_desc, self.seq = name, "", seq

    def _get_sequence_number_for_group(self) -> int:
        return self.seq

    def size(self) -> int:
        return 2


def test_full_fr_reads_need_a_new_pending_op_and_a_minute_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle groups never cost a full dump; a stalled group with a new op does, at most N a minute."""
    pgs = [_Pg("0", 5), _Pg("1", 0), _Pg("2", 3), _Pg("3", 0)]  # "0" stalls with an op in flight
    c10d = SimpleNamespace(_world=SimpleNamespace(pg_map={pg: ("gloo", None) for pg in pgs},
                                                  pg_names={pg: pg.group_name for pg in pgs}))
    dump = {"text": _fr(5, 4, [_entry(5)])}
    calls: list[bool] = []

    def read(include_collectives: bool = True, backend: str = "") -> str:
        calls.append(include_collectives)
        return dump["text"]

    monkeypatch.setattr(collectives, "read_fr_json", read)
    tracker = collectives.CollectiveTracker(fr_after_s=2.0, timing_every_s=0.0, full_reads_per_min=3)
    for t in range(0, 2):
        tracker.groups(c10d, 100.0 + t)
    assert calls == []  # nothing stalled yet: not even a status read
    group = tracker.groups(c10d, 102.5)[0]
    assert [op.seq for op in group.pending] == [5] and tracker.full_reads == 1
    for t in range(3, 30):  # the same op stays pending: status reads only
        assert tracker.groups(c10d, 100.0 + t)[0].pending[0].age_s == pytest.approx(t)
    assert tracker.full_reads == 1 and tracker.status_reads == 28
    # A peer that keeps enqueueing new ops in a stalled group: full reads, but capped per minute.
    for t in range(30, 90):
        dump["text"] = _fr(5 + t, 4 + t, [_entry(5 + t)])
        tracker.groups(c10d, 100.0 + t)
    # 60 new ops in 60 s, 3 reads a minute: at 102.5 (before), 130, 131, then none until 162.5.
    assert tracker.full_reads == 4, tracker.full_reads
    # Everything completed and nothing new: no full read at all, whatever the number of idle groups.
    dump["text"] = _fr(200, 200)
    reads = tracker.full_reads
    for t in range(200, 400):
        assert tracker.groups(c10d, 100.0 + t)[0].pending == []
    assert tracker.full_reads == reads


def test_idle_real_groups_never_trigger_a_full_dump(tmp_path: Any) -> None:
    """A real gloo job (world 1) with a busy group and two that never run a collective."""
    script = textwrap.dedent(f"""
        import json, torch, torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        from ddptop.reporter.collectives import CollectiveTracker
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        busy, idle_a, idle_b = (dist.new_group([0]) for _ in range(3))
        tracker = CollectiveTracker(fr_after_s=2.0, timing_every_s=0.0)
        t = torch.zeros(4)
        import time
        from ddptop.reporter.collectives import decode_fr, read_fr_json
        def busy_status():
            st = decode_fr(read_fr_json(include_collectives=False)).pg_status.get(busy.group_name)
            return None if st is None else [st.last_enqueued_collective, st.last_completed_collective]
        settled, seen = None, []
        for now in range(60):
            if now < 10:
                dist.all_reduce(t, group=busy)
            if now == 9:  # FR marks the last op completed from gloo's thread: wait for that (bounded)
                deadline = time.monotonic() + 60
                while busy_status() != [10, 10] and time.monotonic() < deadline:
                    time.sleep(0.01)
                settled = busy_status()
            reads = tracker.full_reads
            groups = tracker.groups(c10d, 1000.0 + now)
            if tracker.full_reads != reads:  # what FR says right after: why it read
                seen.append([now, busy_status()])
        print(json.dumps([tracker.status_reads, tracker.full_reads,
                          sorted((g.pg, g.seq, len(g.pending)) for g in groups), settled, seen]))
        dist.destroy_process_group()
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    status_reads, full_reads, groups, settled, seen = json.loads(res.stdout.strip().splitlines()[-1])
    # The busy group's tenth all-reduce is enqueued and completed before the clock runs on (a
    # wait for FR's status, bounded): if not (no status, or gloo's thread starved a minute), here.
    assert settled == [10, 10], settled
    assert full_reads == 0, seen  # every group is stalled after 2 s, but nothing is in flight
    assert status_reads > 40
    assert [g[2] for g in groups] == [0, 0, 0, 0]
    assert sorted(g[1] for g in groups) == [0, 0, 0, 10]


def _loaders(train_len: int, eval_len: int, eval_role: str = "eval") -> list[LoaderInfo]:
    return [LoaderInfo(index=0, name="DataLoader(Val)", role=eval_role, length=eval_len, passes=1),
            LoaderInfo(index=1, name="DataLoader(Train)", role="train", length=train_len, passes=1, steps=9)]


def test_unequal_eval_loader_is_its_own_warning() -> None:
    """Training loaders agree, an evaluation loader does not: unequal_eval_batches, not unequal_batches."""
    states = [rank(r, 2, batches_per_epoch=1250, loaders=_loaders(1250, 40 if r else 41)) for r in range(2)]
    found = diagnose(snap(states), {r: samples() for r in range(2)}, NOW)
    assert "unequal_batches" not in kinds(found)
    finding = only(found, "unequal_eval_batches")
    assert finding.severity == "warning" and finding.ranks == [0, 1]
    assert "rank 0: 41, rank 1: 40" in finding.evidence[0]
    # An undecided role (before the first step) is not compared.
    states = [rank(r, 2, loaders=_loaders(1250, 40 if r else 41, eval_role="")) for r in range(2)]
    assert "unequal_eval_batches" not in kinds(diagnose(snap(states), {}, NOW))


def test_unequal_batches_waits_for_ranks_that_know_their_training_loader() -> None:
    """A rank still in a sanity check reports its validation loader: it is not compared yet."""
    decided = [rank(r, 4, batches_per_epoch=1250, loaders=_loaders(1250, 4)) for r in range(3)]
    early = rank(3, 4, batches_per_epoch=4, loaders=_loaders(1250, 4, eval_role="")[:1])
    assert "unequal_batches" not in kinds(diagnose(snap([*decided, early]), {}, NOW))
    short = rank(3, 4, batches_per_epoch=1248, loaders=_loaders(1248, 4))
    assert only(diagnose(snap([*decided, short]), {}, NOW), "unequal_batches").ranks == [3]


def test_rank_detail_lists_every_loader() -> None:
    """The detail screen names each loader, its role, length and pass."""
    state = rank(0, 2, loaders=[*_loaders(1250, 40), LoaderInfo(index=2, name="DataLoader(Test)",
                                                                 worker_pids=[4242], workers=1)])
    view = RankView(rank=0, base=state)
    text = detail_text(view, "running", NOW).plain
    assert "#0 eval  DataLoader(Val)  batch 0/40" in text
    assert "#1 train DataLoader(Train)  batch 0/1250" in text and "steps 9" in text
    assert "#2 ?     DataLoader(Test)" in text and "pids 4242" in text


def test_unequal_eval_loaders_named_after_the_job_died() -> None:
    """Post-mortem too: a dead rank's loader lengths are facts (rank 3's validation loader has one more)."""
    states = [msgspec.structs.replace(rank(r, 4, loaders=_loaders(1250, 14 if r == 3 else 13)),
                                      status="crashed" if r == 3 else "torn_down") for r in range(4)]
    finding = only(diagnose(snap(states), {}, NOW), "unequal_eval_batches")
    assert finding.ranks == [3] and "rank 3: 14" in finding.evidence[0]
