"""Growth in steps (#55): a checkpoint disk filled by saves seconds or minutes apart, judged by the
live rule and the post-mortem through their own code (simulated jobs read as the reporter reads
them: ddptop.testing.disk_saves); the end of a rank told by the limit its last state found full."""

from __future__ import annotations

import re

import msgspec
import pytest

from ddptop.diagnosis import DiagnosisConfig, diagnose
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.limits_at_end import at_limit
from ddptop.diagnosis.rules_resources import disk_steps
from ddptop.diagnosis.steps import MIN_RISES, step_growth
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import RankState
from ddptop.testing.disk_saves import MB, SavingJob
from tests.test_diagnosis_rules import NOW, only, rank, samples, snap

TORCH_FULL = ("RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 41943104 vs 41943040")


def _disk_findings(job: SavingJob, i: int) -> list[Finding]:
    now = job.samples[i].time
    found = diagnose(build_snapshot("j", 1, [job.state_at(i)], {}, now), {0: job.history(i)}, now)
    return [f for f in found if f.kind == "disk_exhaustion"]


def _looks(job: SavingJob) -> list[tuple[float, list[Finding]]]:
    return [(x.time, _disk_findings(job, i)) for i, x in enumerate(job.samples)]


@pytest.mark.parametrize("every", [25.0, 60.0])
def test_kept_saves_are_warned_from_the_fourth_to_the_death_in_every_look(every: float) -> None:
    job = SavingJob(every_s=every)  # 40 MB saves on 300 MB: the 8th does not fit
    assert job.died_at is not None
    looks = _looks(job)
    first = next(i for i, (_, found) in enumerate(looks) if found)
    assert all(found for _, found in looks[first:])  # held in every look until the death
    lead = job.died_at - looks[first][0]
    assert lead >= 3.5 * every, lead  # from the 4th save on: four more to go
    f = looks[-1][1][0]
    assert f.forecast is not None and f.forecast.step_bytes == 40 * MB and f.forecast.steps_fit == 0
    assert f.forecast.step_every_s == pytest.approx(every, rel=0.05)
    said = r"the next save of 40.0M \(one every [\dms.]+\) will not fit; 280.0M of 300.0M"
    assert re.search(said, f.title), f.title
    # the failing save's due time holds between saves: it is what the ETA counts down to
    dues = {round(found[0].forecast.reaches_at) for _, found in looks[first:first + int(every) - 2]
            if found[0].forecast is not None}
    assert len(dues) == 1, dues


def test_the_due_save_is_counted_from_now() -> None:
    job = SavingJob(every_s=30.0)
    i = next(i for i, x in enumerate(job.samples) if _disk_findings(job, i))
    f = _disk_findings(job, i)[0]
    assert "the 4th save from now of 40.0M (one every 30.0s) will not fit" in f.title, f.title
    assert f.forecast is not None and f.forecast.steps_fit == 3
    assert any("its last 4 saves: 40.0M each, one every 30.0s, 40.0M of each kept" in e for e in f.evidence)


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_rotated_saves_are_never_warned(keep: int) -> None:
    job = SavingJob(every_s=25.0, keep=keep, seconds=600.0, jitter=0.1)
    assert job.died_at is None
    assert not any(found for _, found in _looks(job))


def test_saves_ten_minutes_apart_are_warned_two_saves_ahead() -> None:
    job = SavingJob(every_s=600.0, seconds=6 * 3600)
    assert job.died_at is not None
    first = next(t for t, found in _looks(job) if found)
    assert job.died_at - first >= 1.9 * 600  # beyond the 15 minutes a trend warns within


def test_a_forecast_is_withdrawn_when_the_saves_stop_not_when_one_is_late() -> None:
    levels = [(NOW + 30.0 * k, k * 40 * MB) for k in range(1, 6)]  # five saves, 30 s apart
    last = levels[-1][0]
    assert step_growth(levels, 300 * MB, last + 45) is not None  # the next is 15 s late
    assert step_growth(levels, 300 * MB, last + 70) is not None
    assert step_growth(levels, 300 * MB, last + 80) is None  # 2.5 spacings: stopped


def test_warm_up_and_one_off_writes_are_no_trend() -> None:
    three = [(NOW + 30.0 * k, k * 40 * MB) for k in range(1, MIN_RISES)]
    assert step_growth(three, 300 * MB, three[-1][0] + 1) is None  # too few saves
    odd = [(NOW, 0), (NOW + 30, 40 * MB), (NOW + 60, 140 * MB), (NOW + 200, 150 * MB), (NOW + 210, 190 * MB)]
    assert step_growth(odd, 300 * MB, NOW + 211) is None  # neither alike in size nor spacing


def test_a_save_read_mid_way_leaves_the_forecast_as_it_was() -> None:
    levels = [(NOW + 30.0 * k, k * 40 * MB) for k in range(1, 6)]
    before = step_growth(levels, 300 * MB, levels[-1][0] + 29)
    during = step_growth([*levels, (levels[-1][0] + 30, 215 * MB)], 300 * MB, levels[-1][0] + 30.5)
    after = step_growth([*levels, (levels[-1][0] + 30, 215 * MB), (levels[-1][0] + 31, 240 * MB)],
                        300 * MB, levels[-1][0] + 31.5)
    assert before is not None and during is not None and after is not None
    assert (during.due_at, during.fit, during.used) == (before.due_at, before.fit, before.used)
    assert after.rises == before.rises + 1 and after.step == 40 * MB  # the two reads: one save


def _died_of_a_full_disk(job: SavingJob, reason: str = TORCH_FULL) -> tuple[RankState, Finding]:
    assert job.died_at is not None
    last = len(job.samples) - 1
    dead = job.state_at(last, rank=1, world_size=2, status="crashed", exited_at=job.died_at, exit_code=1,
                        exit_reason=reason)
    alive = rank(0, 2)
    history = [msgspec.structs.replace(x) for x in job.samples]
    found = diagnose(snap([alive, dead]), {0: samples(), 1: history}, NOW)
    return dead, only(found, "rank_lost")


def test_a_save_that_did_not_fit_is_told_as_the_full_disk_whatever_torch_says() -> None:
    job = SavingJob(every_s=25.0, start=NOW - 400)
    _dead, lost = _died_of_a_full_disk(job)
    said = "the checkpoint disk (/ckpt) had no room for another save: 280.0M of 300.0M at the last sample"
    assert said in lost.title and "one save takes 40.0M" in lost.title, lost.title
    assert "unexpected pos" in lost.title
    told = [e for e in lost.evidence if "foreseen" in e]
    said = re.search(r"foreseen 1m(\d\d)s before, at \d\d:\d\d:\d\d: its checkpoint disk \(/ckpt\)", told[0])
    assert said, lost.evidence
    # the post-mortem replays what the live rule said: its first warning, to the second
    assert job.died_at is not None
    first = next(t for t, found in _looks(job) if found)
    assert abs((job.died_at - first) - (60 + int(said[1]))) <= 1.5, (job.died_at - first, told)
    assert "keep the last N checkpoints" in lost.remedy


def test_a_disk_with_room_to_spare_is_not_blamed() -> None:
    job = SavingJob(every_s=25.0, start=NOW - 400, total=2048 * MB, seconds=200.0)
    state = job.state_at(len(job.samples) - 1, status="crashed", exited_at=NOW, exit_code=1)
    assert at_limit(state, job.samples[-1].time + 1) is None


def test_a_limit_full_an_hour_before_the_death_is_not_its_cause() -> None:
    full = rank(1, 2, time=NOW - 3600, cgroup_path="/job", cgroup_memory_limit_bytes=GIB,
                cgroup_memory_bytes=GIB)
    assert at_limit(full, NOW) is None
    assert at_limit(msgspec.structs.replace(full, time=NOW - 5), NOW) is not None


GIB = 1 << 30


def test_a_warning_made_holds_while_the_spacings_median_moves() -> None:
    # saves 30 s apart (within 10 %) on 2 GB: with this seed, the save after the first warning
    # moves the median spacing enough to put the failing save beyond the 15 minutes again
    job = SavingJob(every_s=30.0, total=2048 * MB, jitter=0.1, seed=4, seconds=3000.0)
    warned = [disk_steps([job.state_at(i)], x.time, DiagnosisConfig())[1] for i, x in enumerate(job.samples)]
    first = warned.index(True)
    assert all(warned[first:]), warned[first:].index(False)
    g, _ = disk_steps([job.state_at(first)], job.samples[first].time, DiagnosisConfig())
    assert g is not None and g.eta_s > 800  # warned 15 minutes ahead, not only at the end


def test_the_post_mortem_judges_the_levels_the_rank_kept_not_more() -> None:
    # a rank that kept no baseline (its first save no rise): the post-mortem must not rebuild
    # one from the samples (it would warn a save earlier than the live rule did)
    job = SavingJob(every_s=25.0, start=NOW - 400)
    job.levels_at = [levels[1:] for levels in job.levels_at]
    _dead, lost = _died_of_a_full_disk(job)
    said = re.search(r"foreseen (\d+)m(\d\d)s before", next(e for e in lost.evidence if "foreseen" in e))
    assert said and job.died_at is not None
    lead = job.died_at - next(t for t, found in _looks(job) if found)
    assert abs(lead - (60 * int(said[1]) + int(said[2]))) <= 1.5, (lead, said[0])
