"""The enqueue timer: when a rank enqueued its collectives, from polled seqs, no FR dump (#57)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddptop.reporter.enqueue_timer import MAX_GAP_S, moves, next_tick


def test_a_move_is_timed_between_the_two_polls_that_bracket_it() -> None:
    polls = [(10.000, 5), (10.002, 5), (10.004, 7), (10.006, 7), (10.008, 8)]
    assert moves(polls) == pytest.approx({6: 10.003, 7: 10.003, 8: 10.007})


def test_moves_seen_after_a_long_gap_or_a_reset_are_not_timed() -> None:
    late = 10.002 + MAX_GAP_S + 0.001  # the poller waited for the GIL: the moment is unknown
    assert moves([(10.0, 5), (10.002, 5), (late, 6), (late + 0.002, 7)]) == pytest.approx({7: late + 0.001})
    # a group rebuilt: its seq starts again
    assert moves([(10.0, 500), (10.002, 3), (10.004, 4)]) == pytest.approx({4: 10.003})
    assert moves([(10.0, 5), (10.002, 5 + 65)]) == {}  # more seqs at once than any burst times


def test_ticks_are_the_same_instant_for_every_rank() -> None:
    assert next_tick(1000.2, 5.0) == 1005.0
    assert next_tick(1005.0, 5.0) == 1010.0  # on a tick: the next one
    assert next_tick(1019.9, 30.0) == 1020.0  # the cadence's ticks are ticks of the early one too
    assert next_tick(1020.0, 30.0) % 5.0 == 0.0


def test_real_gloo_group_enqueues_are_timed_within_the_poll_spacing(tmp_path: Path) -> None:
    """A real process group (gloo, world 1): the script all-reduces every 20 ms and notes when
    it called each one; the timer, bursting on 1 s ticks, times the same seqs within MAX_GAP_S."""
    script = textwrap.dedent(f"""
        import json, time, torch, torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        from ddptop.reporter.collectives import _process_groups
        from ddptop.reporter.enqueue_timer import EnqueueTimer
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        errors = []
        timer = EnqueueTimer(1.0, lambda: _process_groups(c10d), errors.append)
        timer.start()
        t, called, marks = torch.zeros(4), {{}}, {{}}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(marks.get("0", {{}})) < 20:
            seq = int(dist.group.WORLD._get_sequence_number_for_group()) + 1
            called[seq] = time.time()
            dist.all_reduce(t)
            time.sleep(0.02)
            for name, got in timer.take().items():
                marks.setdefault(name, {{}}).update(got)
        timer.stop()
        timed = {{str(k): v for k, v in marks.get("0", {{}}).items()}}
        asked = {{str(k): v for k, v in called.items()}}
        print(json.dumps([asked, timed, timer.bursts, [repr(e) for e in errors]]))
        dist.destroy_process_group()
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=env, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    called, marks, bursts, errors = json.loads(res.stdout.strip().splitlines()[-1])
    assert errors == [] and bursts >= 1
    assert len(marks) >= 20, (len(marks), bursts)
    # Each timed moment lies after the script called that all-reduce, by at most the poll gap
    # that bracketed it (the midpoint of a gap of at most MAX_GAP_S) plus the call itself.
    off = {seq: t - called[seq] for seq, t in marks.items()}
    assert all(-MAX_GAP_S / 2 - 0.001 <= d <= MAX_GAP_S for d in off.values()), off
