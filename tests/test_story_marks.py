"""The findings' story on the rank table (#45): culprits lead, marked CAUSE; each victim shows
whom it waits for, from the wait-for graph's edges (``Finding.waits``)."""

from __future__ import annotations

from ddptop.diagnosis.finding import Finding, Forecast, WaitEdge
from ddptop.tui.story_marks import CAUSE, VICTIM, story_marks


def test_culprits_lead_and_victims_say_whom_they_wait_for() -> None:
    stall = Finding(kind="collective_stall", severity="critical", ranks=[3], victims=[0, 1, 2], title="t",
                    waits=[WaitEdge(ranks=[0], waits_for=[2], op="gloo:all_reduce #128 of group 1"),
                           WaitEdge(ranks=[1, 2], waits_for=[3], op="gloo:all_reduce #41 of group 4")])
    marks, leads = story_marks([stall])
    assert leads == [3]
    assert marks == {3: CAUSE, 0: "→2", 1: "→3", 2: "→3"}


def test_uncertain_and_minor_findings_name_no_cause() -> None:
    tie = Finding(kind="collective_mismatch", severity="critical", ranks=[0, 1], certain=False, title="t")
    slow = Finding(kind="straggler", severity="warning", ranks=[5], title="t")
    lost = Finding(kind="rank_lost", severity="critical", ranks=[2, 0, 1], victims=[0, 1], title="t")
    info = Finding(kind="collective_stall", severity="info", ranks=[7], victims=[6], title="t")
    marks, leads = story_marks([tie, slow, lost, info])
    assert leads == [2] and marks == {2: CAUSE, 0: VICTIM, 1: VICTIM}


def test_a_long_list_of_ranks_waited_for_is_cut_to_fit_the_column() -> None:
    evens = list(range(0, 64, 2))
    wide = Finding(kind="collective_stall", severity="warning", ranks=evens, victims=[1], title="t",
                   waits=[WaitEdge(ranks=[1], waits_for=evens, op="x")])
    marks, _ = story_marks([wide])
    assert marks[1].startswith("→0,2,4") and marks[1].endswith("…") and len(marks[1]) <= 13


def test_ranks_sharing_a_limit_about_to_run_out_say_what_and_when() -> None:
    forecast = Forecast(resource="cgroup memory", where="/job", used_bytes=3 << 30, limit_bytes=4 << 30,
                        rate_bytes_per_s=8 << 20, eta_s=250.0, at=1.0, reaches_at=251.0, shared_by=[0, 1])
    risk = Finding(kind="memory_exhaustion", severity="warning", ranks=[0, 1], title="t", forecast=forecast)
    cause = Finding(kind="rank_lost", severity="critical", ranks=[1], title="t")
    marks, leads = story_marks([risk, cause])
    assert marks == {0: "OOM ⏱4m10s", 1: "CAUSE"} and leads == [1]  # a cause says more than a risk
    info = Finding(kind="shm_exhaustion", severity="info", ranks=[2], title="t", forecast=forecast)
    assert story_marks([info]) == ({}, [])
