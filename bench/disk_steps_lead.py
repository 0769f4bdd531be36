"""How long before a full checkpoint disk the warning comes, per save spacing, and how often a
healthy saving job is warned (#55).

Simulated jobs (:mod:`ddptop.testing.disk_saves`: the disk read as the reporter reads it, its
levels kept by the reporter's own function) pushed through the live rule
(``rules_resources.resource_exhaustion``, a look every second over the 40 s of samples a
viewer's rules get) and the post-mortem (``foresight.death_foreseen``). Saves of 40 MB, every
5 s, 30 s, 2 min and 10 min (each spacing varying by up to 10 %, five seeds), kept on a
300 MB disk (the 8th fails) and on a 2 GB one (the 52nd fails); healthy: the same saves rotated
(keep the last 2, 3 or 5) on the 300 MB disk, and a job that writes 100 MB once then saves
rotated, watched for 40 spacings.

    python bench/disk_steps_lead.py [--seeds 5]

Prints a markdown table (docs/performance.md, "Growth in steps").
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.foresight import death_foreseen
from ddptop.diagnosis.rules_resources import resource_exhaustion
from ddptop.model.snapshot import build_snapshot
from ddptop.testing.disk_saves import MB, SavingJob

SPACINGS = (5.0, 30.0, 120.0, 600.0)
CONFIG = DiagnosisConfig()


def looks(job: SavingJob) -> list[tuple[float, bool]]:
    """(time, warned of the disk) at each of the job's samples, as the live rule judges it."""
    out: list[tuple[float, bool]] = []
    for i, x in enumerate(job.samples):
        state = job.state_at(i)
        snapshot = build_snapshot("j", 1, [state], {}, x.time)
        found = resource_exhaustion(snapshot, {0: job.history(i)}, x.time, CONFIG)
        out.append((x.time, any(f.kind == "disk_exhaustion" for f in found)))
    return out


def dying(every: float, total: int, seed: int) -> tuple[float, float, float]:
    """(lead of the warning that held to the death, share of looks from the first warning to
    the death that held it, the post-mortem's 'foreseen ... before' in seconds; -1: none)."""
    job = SavingJob(every_s=every, total=total, jitter=0.1, seed=seed, seconds=80 * every + 600)
    assert job.died_at is not None
    seen = looks(job)
    first = next((t for t, warned in seen if warned), None)
    lead = -1.0
    for t, warned in reversed(seen):  # the last unbroken run of warnings
        if not warned:
            break
        lead = job.died_at - t
    held = (sum(w for t, w in seen if first is not None and t >= first) /
            max(1, sum(1 for t, _ in seen if first is not None and t >= first)))
    final = job.state_at(len(job.samples) - 1, status="crashed", exited_at=job.died_at,
                         exit_reason="RuntimeError: [enforce fail at inline_container.cc:672] . "
                                     "unexpected pos 41943104 vs 41943040")
    told = death_foreseen(final, job.samples, job.died_at, shm=False)
    m = re.search(r"foreseen (?:(\d+)h)?(?:(\d+)m)?([\d.]+)s before", told)
    after = -1.0 if m is None else int(m[1] or 0) * 3600 + int(m[2] or 0) * 60 + float(m[3])
    return lead, held, after


def healthy(every: float, keep: int | None, seed: int, one_off: bool = False) -> tuple[int, int]:
    """(looks warned, looks) for a job whose saves are rotated (or written once, then rotated)."""
    job = SavingJob(every_s=every, keep=keep, jitter=0.1, seed=seed, seconds=40 * every,
                    base=100 * MB if one_off else 0)
    assert job.died_at is None
    seen = looks(job)
    return sum(w for _, w in seen), len(seen)


def fmt(seconds: float) -> str:
    if seconds < 0:
        return "none"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    seeds = range(args.seeds)
    t0 = time.process_time()
    print("| save spacing | disk (saves that fit) | warning lead (min-max) | looks held from the first "
          "warning | post-mortem 'foreseen' | healthy looks warned (keep 2 / 3 / 5 / one-off) |")
    print("|---|---|---|---|---|---|")
    for every in SPACINGS:
        for total, fits in ((300 * MB, 7), (2048 * MB, 51)):
            runs = [dying(every, total, s) for s in seeds]
            leads = [r[0] for r in runs]
            held = min(r[1] for r in runs)
            after = [r[2] for r in runs]
            quiet = ""
            if total == 300 * MB:
                parts = []
                for keep, once in ((2, False), (3, False), (5, False), (2, True)):
                    counts = [healthy(every, keep, s, once) for s in seeds]
                    parts.append(f"{sum(c[0] for c in counts)}/{sum(c[1] for c in counts)}")
                quiet = " / ".join(parts)
            print(f"| {fmt(every)} | {total // MB} MB ({fits}) | {fmt(statistics.median(leads))} "
                  f"({fmt(min(leads))}-{fmt(max(leads))}) | {held:.0%} | "
                  f"{fmt(statistics.median(after))} ({fmt(min(after))}-{fmt(max(after))}) | {quiet} |",
                  flush=True)
    print(f"\n{time.process_time() - t0:.0f} s of CPU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
