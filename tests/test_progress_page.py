"""The progress page (#20 item 3): what the training thread's hooks write into a shared file
page outlives the rank, whatever kills it; the node agent reads it and lays it over the
rank's last known state; a viewer's stub for a dead rank never erases what was known.

Real processes (a child trains through the real hooks over real DataLoaders, then SIGKILLs
or aborts itself), real files; no torchrun: that path is tests/test_postmortem_e2e.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from ddptop.model.job import JobModel
from ddptop.protocol import STUB_LOCAL_RANK, LoaderInfo, RankExit, RankState, RecordEntry, StateMsg
from ddptop.store.progress_page import PAGE_BYTES, ProgressPage, apply_page, read_page

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from ddptop.store.progress_page import ProgressPage
    from ddptop.reporter.loaders import make_next, start_pass
    from ddptop.reporter.progress import Progress, _optimizer_post_hook

    p = Progress()
    p.attach_page(ProgressPage.create(Path(sys.argv[1]), 5, time.time() - time.perf_counter()))
    train = DataLoader(TensorDataset(torch.zeros(40, 2)), batch_size=4)      # 10 batches
    val = DataLoader(TensorDataset(torch.zeros(28, 2)), batch_size=4)        # 7 batches
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

    def run(loader, batches, step):
        it = iter(loader)
        start_pass(p, loader, it)
        nxt = make_next(type(it).__next__, p)
        for _ in range(batches):
            nxt(it)
            if step:
                _optimizer_post_hook(opt, (), {}, _p=p)

    run(train, 10, True)    # a whole training pass: 10 steps
    run(val, 5, False)      # 5 batches into evaluation, no step
    how = sys.argv[2]
    print("ready", flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os.abort()
""")


def run_child(tmp_path: Path, how: str) -> Path:
    page = tmp_path / "job.5.page"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(page), how], capture_output=True, text=True,
                          timeout=120, check=False)
    want = -signal.SIGKILL if how == "kill" else -signal.SIGABRT
    assert proc.returncode == want and "ready" in proc.stdout, (proc.returncode, proc.stderr[-2000:])
    return page


@pytest.mark.parametrize("how", ["kill", "abort"])
def test_a_dead_ranks_page_tells_its_step_and_every_loader(tmp_path: Path, how: str) -> None:
    page = run_child(tmp_path, how)
    facts = read_page(page.read_bytes())
    assert facts is not None and facts.rank == 5 and facts.step == 10
    train, val = facts.loaders
    assert (train.index, train.role, train.length, train.batch, train.steps, train.passes_completed) == \
        (0, "train", 10, 10, 10, 1)
    # Iterated after steps were counted and fed none: an evaluation loader, mid-pass.
    assert (val.index, val.role, val.length, val.batch, val.steps, val.passes_completed) == \
        (1, "eval", 7, 5, 0, 0)
    assert facts.train_index == 0 and train.name == "DataLoader(TensorDataset)"
    assert facts.last_step_at > 0 and val.last_batch_at >= facts.last_step_at


def test_the_page_is_laid_over_the_last_sample_and_keeps_what_only_the_sample_had(tmp_path: Path) -> None:
    facts = read_page(run_child(tmp_path, "kill").read_bytes())
    assert facts is not None
    sample = RankState(rank=5, local_rank=1, world_size=8, host="h", pid=facts.pid, time=1.0, step=3,
                       rss_bytes=123, loaders=[LoaderInfo(index=0, name="DataLoader(TensorDataset)",
                                                          role="train", length=10, batch=3, workers=2,
                                                          worker_pids=[7, 8])])
    final = apply_page(sample, facts)
    assert (final.step, final.epoch, final.batch, final.batches_per_epoch) == (10, 0, 10, 10)
    assert final.rss_bytes == 123
    assert [(i.index, i.role, i.length, i.batch) for i in final.loaders] == [(0, "train", 10, 10),
                                                                             (1, "eval", 7, 5)]
    assert final.loaders[0].worker_pids == [7, 8] and final.time >= facts.last_step_at
    # Another process's page (a restarted rank's predecessor) is not laid over.
    other = msgspec.structs.replace(sample, pid=facts.pid + 1)
    assert apply_page(other, facts) is other
    # A run resumed at epoch 14 (its sampler's set_epoch, which the page does not hold), its
    # loader built anew for each pass: the page's passes go on from the sample's epoch.
    resumed = msgspec.structs.replace(sample, epoch=14, loaders=[
        msgspec.structs.replace(sample.loaders[0], passes=1, rebuilt=3)])
    final = apply_page(resumed, facts)
    assert (final.epoch, final.loaders[0].passes, final.loaders[0].rebuilt) == (14, 1, 3)


def test_damaged_or_foreign_pages_are_refused(tmp_path: Path) -> None:
    data = run_child(tmp_path, "kill").read_bytes()
    assert read_page(data[:PAGE_BYTES - 1]) is None
    assert read_page(b"\0" * 8 + data[8:]) is None  # no magic: never whole
    assert read_page(os.urandom(PAGE_BYTES)) is None
    # Garbage behind a valid header decodes to bounded, non-negative numbers, never a crash.
    garbage = data[:64] + os.urandom(PAGE_BYTES - 64)
    facts = read_page(garbage)
    assert facts is None or (facts.step >= 0 and len(facts.loaders) <= 16)


def test_a_private_page_takes_the_writes_before_a_file_is_attached() -> None:
    page = ProgressPage.private()
    page.write_loader(3, 19, "x" * 200, None, 2, 1, 4, 0, None)
    facts = read_page(bytes(page.buffer))
    assert facts is None  # no magic: a private page is never read as a rank's


def test_a_viewers_stub_never_erases_what_was_known() -> None:
    """A viewer that saw a rank's socket close and found only its crash file makes a stub
    (local_rank -1, step 0, no loaders); the model keeps the last sample's numbers."""
    model = JobModel()
    known = RankState(rank=3, local_rank=3, world_size=4, host="h", pid=77, time=10.0, step=13, rss_bytes=5,
                      loaders=[LoaderInfo(index=0, name="L", role="train", length=13, batch=13)])
    model.apply(RecordEntry(time=10.0, rank=3, message=StateMsg(state=known)))
    stub = RankState(rank=3, local_rank=STUB_LOCAL_RANK, world_size=4, host="h", pid=77, time=11.0,
                     status="crashed", exit_reason="Aborted", crash_file="/x.crash")
    model.apply(RecordEntry(time=11.0, rank=3, message=StateMsg(state=stub)))
    model.apply(RankExit(time=11.0, rank=3, pid=77, host="h", signal="SIGABRT"))
    st = model.ranks[3].state
    assert st is not None
    assert (st.step, st.rss_bytes, st.status, st.exit_reason) == (13, 5, "crashed", "Aborted")
    assert [i.length for i in st.loaders] == [13] and [s.step for s in model.ranks[3].history] == [13, 13]
    # A stub of another process (a restarted rank) is that process's word, not laid over.
    other = msgspec.structs.replace(stub, pid=78, time=12.0)
    model.apply(RecordEntry(time=12.0, rank=3, message=StateMsg(state=other)))
    assert model.ranks[3].state is not None and model.ranks[3].state.step == 0
