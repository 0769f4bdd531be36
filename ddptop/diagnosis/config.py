"""Thresholds of the diagnosis, in one place (documented in ``docs/diagnosis.md``).

Every number a rule compares against lives here so that tests, the TUI and ``doctor`` can
tune them together, and so that the documentation has one table to mirror.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DiagnosisConfig:
    """Thresholds of every rule; the defaults are what ``ddptop doctor`` uses."""

    # collectives
    stall_s: float = 5.0  # peers waited this long in a collective another rank never entered
    stall_critical_s: float = 60.0  # ... and this long makes it critical
    first_collective_stall_s: float = 10.0  # every rank inside collective #1 this long (P2P hang)
    all_stuck_s: float = 60.0  # every rank inside the same later collective (slow save is younger)
    all_stuck_critical_s: float = 300.0
    # progress
    warmup_s: float = 15.0  # a rank younger than this (start or restart) is not judged on speed
    window_s: float = 30.0  # history window for "persistent" (straggler, input_bound)
    min_samples: int = 5  # samples per rank needed in the window
    straggler_ratio: float = 1.3  # median step time vs the others' median
    straggler_min_diff_s: float = 0.05  # ... and at least this much slower per step
    straggler_wait_gap: float = 0.25  # data-wait share above the others' (absolute)
    straggler_late_share: float = 0.2  # enters collectives this share of a step after the first
    input_bound_wait: float = 0.5  # data-wait share of each step
    input_bound_ready: float = 0.5  # median prefetched batches at or below this: queue empty
    # system
    shm_used_fraction: float = 0.8
    shm_critical_fraction: float = 0.95
    shm_min_total_bytes: int = 512 * 1024 * 1024
    # resources heading for their limit (memory_exhaustion, shm_exhaustion, disk_exhaustion):
    # the floor of the newest samples (those the rate rules get: window_s + a margin) rising
    exhaustion_warning_s: float = 900.0  # the limit reached in under this: warning
    exhaustion_critical_s: float = 120.0  # ... under this: critical
    trend_min_span_s: float = 20.0  # the rising floor seen over at least this long
    trend_warmup_s: float = 30.0  # a rank's first seconds (imports, the model, a warm-up) not judged
