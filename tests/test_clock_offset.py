"""A viewer's estimate of a node agent's clock: delay shows as age, never as a clock offset.

Every message an agent stamps and a viewer reads bounds "ours minus the agent's" from above
only. Seen on a loaded CI machine (tests/test_scale_32k.py): the viewer read a tail of the
agents four minutes late, took each digest's own delay as the offset, and showed their ranks'
pre-hang states as current: healthy ranks named as ranks that "never entered" the collective.
"""

from __future__ import annotations

from itertools import pairwise

from ddptop.client.agents import ClockOffset, reply_entries
from ddptop.protocol import AgentReply, RankState, RecordEntry, StateMsg

T0 = 1_700_000_000.0


def test_a_backlog_is_not_taken_for_a_clock_offset() -> None:
    clock = ClockOffset()
    for i in range(10):  # fresh messages: 2 ms on the way
        clock.observe(T0 + i + 0.002, T0 + i)
    # Then a digest stamped at the agent's T0 + 10 is read four minutes late.
    estimate = clock.observe(T0 + 250.0, T0 + 10.0)
    assert abs(estimate - 0.002) < 0.25, estimate  # at most MAX_SLEW * 240 s of creep
    # Its ranks' states land where they were stamped: four minutes old, not now.
    assert T0 + 10.0 + estimate < T0 + 11.0


def test_the_first_message_and_a_clock_ahead_are_taken_at_once() -> None:
    clock = ClockOffset()
    assert clock.value == 0.0  # nothing heard: the clocks taken as equal
    assert clock.observe(T0 + 5.0, T0) == 5.0  # the agent's clock 5 s behind ours
    assert clock.observe(T0 + 6.0, T0 + 3.0) == 3.0  # a lower bound is always the better one


def test_a_clock_that_slews_or_steps_back_is_followed_no_faster_than_a_clock_slews() -> None:
    clock = ClockOffset()
    clock.observe(T0, T0)
    # The agent's clock stepped back by 1 s: every bound is now 1 s higher.
    seen = [clock.observe(T0 + k * 10.0, T0 + k * 10.0 - 1.0) for k in range(1, 201)]
    assert seen[0] <= 10 * ClockOffset.MAX_SLEW + 1e-9
    assert all(b >= a for a, b in pairwise(seen))  # it only creeps up
    assert abs(seen[-1] - 1.0) < 1e-9  # 1 s of step at 1 ms/s: caught up within 2,000 s


def test_an_agents_reply_is_moved_by_the_estimate_not_by_its_own_delay() -> None:
    clock = ClockOffset()
    clock.observe(T0 + 0.001, T0)
    state = RankState(rank=3, local_rank=3, world_size=8, host="n1", pid=7, job_id="j", time=T0 + 1.0)
    entry = RecordEntry(time=T0 + 1.0, rank=3, message=StateMsg(state=state))
    reply = AgentReply(time=T0 + 1.0, entries=[entry])
    clock.observe(T0 + 61.0, reply.time)  # the reply sat a minute behind a backlog
    (entry,) = reply_entries(reply, clock.value)
    assert entry.time < T0 + 2.0  # a minute old on our clock, as it is
