"""Pure tests of stack grouping and its one-line summaries."""

from __future__ import annotations

from ddptop.protocol import FrameStack, StacksMsg, ThreadStack
from ddptop.tui.stack_groups import group_stacks, render_groups, summarize
from tests.probes_tui.fakes import stack

TRAIN = ["main", "train_step", "backward", "all_reduce"]


def test_identical_stacks_grouped_with_rank_ranges() -> None:
    stacks = {r: stack(r, TRAIN) for r in (0, 1, 2, 5)}
    stacks[3] = stack(3, ["main", "save_checkpoint", "all_gather"])
    groups = group_stacks(stacks)
    assert [g.ranks for g in groups] == [[0, 1, 2, 5], [3]]
    assert groups[0].summary() == "ranks 0-2,5: all_reduce ← backward ← train_step ← train.py:13"
    assert groups[1].summary() == "rank 3: all_gather ← save_checkpoint ← main ← train.py:12"


def test_main_thread_is_compared_not_helper_threads() -> None:
    a = stack(0, TRAIN)
    b = stack(1, TRAIN)
    b.threads[0].frames = [FrameStack(file="/x.py", line=1, function="other")]
    assert len(group_stacks({0: a, 1: b})) == 1


def test_summary_points_at_user_code_not_libraries() -> None:
    frames = [FrameStack(file="/home/u/train.py", line=41, function="main"),
              FrameStack(file="/venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
                         line=2800, function="all_reduce")]
    assert summarize(frames) == "all_reduce ← main ← train.py:41"


def test_render_lists_failures_and_handles_empty() -> None:
    text = render_groups(group_stacks({0: stack(0, TRAIN)}), {1: "no answer within 5 s"})
    assert "rank 0: all_reduce" in text and "rank 1: no stack (no answer within 5 s)" in text
    assert render_groups([], {}) == "no stacks received"
    empty = StacksMsg(rank=0, time=0.0, threads=[ThreadStack(thread_id=1, name="m", frames=[])])
    assert group_stacks({0: empty})[0].summary() == "rank 0: (no Python frames)"
