"""Where the culprit is in the code (#34 item 2): the user's frame, read in-process, told in
the finding and in the rank's detail. The real job is tests/test_culprit_frames_e2e.py."""

from __future__ import annotations

import threading
import time

from ddptop.diagnosis import diagnose
from ddptop.frames import frame_text, user_frame
from ddptop.model.rank_view import RankView
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import CollectiveGroup, FrameStack, PendingOp, RankState, StuckReport
from ddptop.reporter.where import main_thread_frames, sample_where
from ddptop.tui.screens.detail import detail_text

NOW = 1_000_000.0
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def test_the_users_frame_skips_torch_ddptop_and_the_standard_library() -> None:
    stack = [FrameStack(file="/home/me/train.py", line=88, function="main"),
             FrameStack(file="/home/me/model.py", line=12, function="forward_hook"),
             FrameStack(file="/usr/lib/python3.11/threading.py", line=320, function="wait"),
             FrameStack(file=TORCH, line=2500, function="all_reduce"),
             FrameStack(file="/venv/lib/python3.11/site-packages/ddptop/reporter/progress.py", line=1,
                        function="wrapped")]
    assert user_frame(stack) == stack[1] and frame_text(stack[1]) == "me/model.py:12 in forward_hook"
    assert user_frame(stack[2:]) is None
    lightning = FrameStack(file="/venv/lib/python3.11/site-packages/lightning/fit.py", line=3, function="run")
    assert user_frame([lightning, stack[3]]) == lightning  # a framework is not torch


def test_the_reporter_reads_the_main_threads_frame_only_while_it_makes_no_progress() -> None:
    """In this process: the main thread sits in this test function while a thread samples it."""
    s = RankState(rank=0, local_rank=0, world_size=1, host="h", pid=1, status="running", start_time=NOW - 60,
                  last_step_at=NOW - 0.5, step_time_s=0.1)
    seen: list[FrameStack | None] = []

    def sampler(now: float) -> None:
        sample_where(s, now)
        seen.append(s.where)

    t = threading.Thread(target=sampler, args=(NOW,))  # progressing: nothing read
    t.start()
    t.join(5)
    t = threading.Thread(target=sampler, args=(NOW + 10,))  # 10 s without a step
    t.start()
    while t.is_alive():
        time.sleep(0.001)  # the main thread is here, in this test, while the thread reads it
    assert seen[0] is None and seen[1] is not None, seen
    assert seen[1].function.startswith("test_the_reporter_reads_the_main_threads_frame"), seen
    # Read from the main thread itself, its own innermost frame is the reader (ddptop's: skipped).
    assert main_thread_frames()[-2].function.startswith("test_the_reporter")
    slow = RankState(rank=0, local_rank=0, world_size=1, host="h", pid=1, status="running",
                     last_step_at=NOW, step_time_s=5.0)
    sample_where(slow, NOW + 10)  # steps of 5 s: 10 s is two steps, not a stall
    assert slow.where is None


def _waiting(rank: int) -> RankState:
    op = PendingOp(seq=28, op="gloo:all_gather", age_s=9.0, started_at=NOW - 9, state="started")
    return RankState(rank=rank, local_rank=rank, world_size=4, host="h", pid=10 + rank, time=NOW,
                     status="running", step=3, last_step_at=NOW - 9, start_time=NOW - 60,
                     collectives=[CollectiveGroup(pg="0", seq=28, size=4, pending=[op],
                                                  seq_changed_at=NOW - 9)])


def test_a_finding_that_names_a_culprit_says_where_it_is() -> None:
    hook = FrameStack(file="/work/probes/fw_fsdp2.py", line=53, function="linger_in_forward_hook")
    lingering = RankState(rank=2, local_rank=2, world_size=4, host="h", pid=12, time=NOW, status="running",
                          step=3, last_step_at=NOW - 9, start_time=NOW - 60, where=hook,
                          collectives=[CollectiveGroup(pg="0", seq=27, size=4, seq_changed_at=NOW - 9)])
    states = [_waiting(0), _waiting(1), lingering, _waiting(3)]
    found = diagnose(build_snapshot("j", 4, states, {}, NOW), {}, NOW)
    (f,) = [f for f in found if f.kind == "collective_stall"]
    assert f.ranks == [2], f
    assert "rank 2 is at probes/fw_fsdp2.py:53 in linger_in_forward_hook (its main thread, read in-process" \
        in " ".join(f.evidence), f.evidence
    # A rank that stopped answering: the frame its node agent read from outside.
    silent = RankState(rank=2, local_rank=2, world_size=4, host="h", pid=12, time=NOW - 30, status="stale",
                       step=3, last_step_at=NOW - 30, start_time=NOW - 60,
                       collectives=[CollectiveGroup(pg="0", seq=27, size=4, seq_changed_at=NOW - 30)],
                       stuck=StuckReport(rank=2, pid=12, time=NOW, since=NOW - 30, source="py-spy",
                                         frames=[hook, FrameStack(file=TORCH, line=1, function="x")]))
    states = [_waiting(0), _waiting(1), silent, _waiting(3)]
    found = diagnose(build_snapshot("j", 4, states, {}, NOW), {}, NOW)
    told = " ".join(e for f in found if 2 in f.ranks for e in f.evidence)
    assert "rank 2 is at probes/fw_fsdp2.py:53 in linger_in_forward_hook (read from outside" in told, found


def test_the_ranks_detail_shows_where_it_is() -> None:
    hook = FrameStack(file="/work/probes/fw_fsdp2.py", line=53, function="linger_in_forward_hook")
    state = RankState(rank=2, local_rank=2, world_size=4, host="h", pid=12, time=NOW, where=hook)
    text = detail_text(RankView(rank=2, base=state), "running", NOW).plain
    assert "where: probes/fw_fsdp2.py:53 in linger_in_forward_hook" in text
