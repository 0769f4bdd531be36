"""A simulated job that saves checkpoints onto a small disk, as its reporter would see it (#55).

The disk's true use second by second (each save written over ``write_s``, the oldest deleted
once a save returns where only ``keep`` are kept), read the way the reporter reads it (at the
first sample after each save returns, and every ``slow_s`` otherwise), its levels kept with
:func:`ddptop.rank_state.kept_levels` (the reporter's own function): the rank's states and
samples the live rule and the post-mortem judge. Used by tests/test_disk_steps.py and
bench/disk_steps_lead.py to push many spacings through the diagnosis's own code.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from ddptop.protocol import RankState, Sample
from ddptop.rank_state import kept_levels

MB = 1 << 20


@dataclass
class SavingJob:
    """One rank saving *step* bytes every *every_s* onto a disk of *total* bytes."""

    every_s: float
    step: int = 40 * MB
    total: int = 300 * MB
    keep: int | None = None  # rotated: only the newest *keep* stay; None: every one stays
    base: int = 0  # used before the first save (other files)
    first_save_s: float = 0.0  # after the start (default: one spacing)
    jitter: float = 0.0  # each spacing varies by up to this share (seeded)
    write_s: float = 0.5  # how long one save writes
    sample_s: float = 1.0
    slow_s: float = 5.0
    start: float = 1_000_000.0
    seconds: float = 3600.0  # the longest the job runs
    seed: int = 0
    died_at: float | None = field(default=None, init=False)  # the failing save's time
    samples: list[Sample] = field(default_factory=list, init=False)
    levels_at: list[list[tuple[float, int]]] = field(default_factory=list, init=False)  # per sample

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        saves: list[float] = []
        t = self.start + (self.first_save_s or self.every_s)
        while t < self.start + self.seconds:
            saves.append(t)
            t += self.every_s * (1 + rng.uniform(-self.jitter, self.jitter))
        self._saves = saves
        self._run()

    def true_use(self, t: float) -> float:
        """The disk's use at *t*: the saves kept so far (the rotated ones gone once the next
        returned) and the one being written, in part; never above the disk."""
        done = bisect.bisect_right(self._saves, t - self.write_s)
        kept = done if self.keep is None else min(done, self.keep)
        writing = self._saves[done] if done < len(self._saves) and self._saves[done] <= t else None
        part = 0.0 if writing is None else (t - writing) / self.write_s
        return min(float(self.base + kept * self.step + part * self.step), float(self.total))

    def _failing(self) -> float | None:
        """When the first save that does not fit finds the disk full (None: every one fits)."""
        for k, s in enumerate(self._saves):
            before = self.base + (k if self.keep is None else min(k, self.keep)) * self.step
            if before + self.step > self.total:
                return s + self.write_s * (self.total - before) / self.step
        return None

    def _run(self) -> None:
        self.died_at = self._failing()
        levels: list[tuple[float, int]] = []
        reading: int | None = None
        slow_due = 0.0
        returned = 0
        t = self.start
        end = min(self.start + self.seconds, self.died_at if self.died_at is not None else float("inf"))
        while t <= end:
            done = bisect.bisect_right(self._saves, t - self.write_s)
            if done != returned or t >= slow_due:  # after a save returned, else the slow cadence
                returned = done
                slow_due = t + self.slow_s if t >= slow_due else slow_due
                reading = int(self.true_use(t))
                writing = done < len(self._saves) and self._saves[done] <= t
                if not writing:  # as the reporter: half a save is not a level
                    levels = kept_levels(levels, t, reading)
            self.samples.append(Sample(time=t, step=int(t - self.start), epoch=0, batch=0, seq=0,
                                       step_time_s=0.1, data_wait_fraction=0.0, loader_ready_batches=None,
                                       cpu_percent=50.0, rss_bytes=1 << 30, gpu_util_percent=None,
                                       disk_used_bytes=reading))
            self.levels_at.append(levels)
            t += self.sample_s

    def state_at(self, i: int, **fields: object) -> RankState:
        """The rank's state at its *i*-th sample (more *fields* as given)."""
        x = self.samples[i]
        base: dict[str, object] = dict(
            rank=0, local_rank=0, world_size=1, host="node-0", pid=1000, job_id="j", status="running",
            time=x.time, start_time=self.start, step=x.step, disk_path="/ckpt/run", disk_mount="/ckpt",
            disk_used_bytes=x.disk_used_bytes, disk_total_bytes=self.total, disk_levels=self.levels_at[i])
        base.update(fields)
        return RankState(**base)  # type: ignore[arg-type]

    def history(self, i: int, span_s: float = 40.0) -> list[Sample]:
        """The samples a live rule gets at the *i*-th: the last *span_s* seconds."""
        now = self.samples[i].time
        return self.samples[bisect.bisect_left(self.samples, now - span_s, hi=i, key=_time): i + 1]


def _time(x: Sample) -> float:
    return x.time
