"""The trend of a resource towards its limit, on constructed histories: a leak is foreseen; the
per-step sawtooth, a warm-up that levels off and noise are not."""

from __future__ import annotations

import math
import random

import pytest

from ddptop.diagnosis.trend import floors, trend

MIB = 1 << 20
T0 = 1_000_000.0


def series(n: int, value, dt: float = 1.0) -> list[tuple[float, float]]:
    """n points, one every *dt* seconds from T0, of value(i, t) (t: seconds since T0)."""
    return [(T0 + i * dt, float(value(i, i * dt))) for i in range(n)]


def test_a_steady_rise_is_foreseen_with_its_rate_and_eta() -> None:
    pts = series(40, lambda i, t: 500 * MIB + 10 * MIB * t)  # +10 MiB/s, 890 MiB at t=39
    found = trend(pts, 1024 * MIB)
    assert found is not None
    assert found.rate == pytest.approx(10 * MIB, rel=0.01)
    assert found.used == pytest.approx(890 * MIB)
    assert found.eta_s == pytest.approx((1024 - 890) / 10, rel=0.02)
    assert found.reaches_at == pytest.approx(T0 + 39 + found.eta_s)


def test_a_rise_on_a_sawtooth_is_judged_by_its_floor_and_timed_from_its_peak() -> None:
    # each 4 s step: activations +300 MiB and freed again; the floor leaks 2 MiB/s
    def value(i: int, t: float) -> float:
        return 1000 * MIB + 2 * MIB * t + (300 * MIB if i % 4 == 3 else (i % 4) * 80 * MIB)

    pts = series(60, value)
    found = trend(pts, 2048 * MIB)
    assert found is not None
    assert found.rate == pytest.approx(2 * MIB, rel=0.15)
    # the peak, not the floor, meets the limit first
    assert found.used >= 1000 * MIB + 2 * MIB * 56 + 300 * MIB
    assert found.eta_s == pytest.approx((2048 * MIB - found.used) / found.rate)


def test_a_sawtooth_alone_is_no_trend() -> None:
    pts = series(60, lambda i, t: 1000 * MIB + (i % 5) * 100 * MIB)
    assert trend(pts, 1600 * MIB) is None


def test_a_sawtooth_whose_period_is_off_the_sample_rate_is_no_trend() -> None:
    pts = series(120, lambda i, t: 1000 * MIB + 200 * MIB * (0.5 + 0.5 * math.sin(t / 1.7)), dt=0.5)
    assert trend(pts, 1300 * MIB) is None


def test_a_warm_up_that_levels_off_is_quiet_once_level() -> None:
    # +40 MiB/s for 15 s, then flat: 600 MiB of 1 GiB
    def value(i: int, t: float) -> float:
        return 0.0 + 40 * MIB * min(t, 15.0) + (i % 3) * 5 * MIB

    assert trend(series(40, value), 1024 * MIB) is None
    # ... even while the rise is still in the window's older half
    assert trend(series(25, value), 1024 * MIB) is None


def test_a_rise_that_decelerates_is_levelling_off() -> None:
    pts = series(40, lambda i, t: 800 * MIB * (1 - math.exp(-t / 8)))
    assert trend(pts, 1024 * MIB) is None


@pytest.mark.parametrize("seed", range(20))
def test_noise_around_a_level_is_no_trend(seed: int) -> None:
    rng = random.Random(seed)
    pts = series(40, lambda i, t: 900 * MIB + rng.gauss(0, 20 * MIB))
    assert trend(pts, 1024 * MIB) is None


@pytest.mark.parametrize("seed", range(10))
def test_a_leak_under_noise_is_still_foreseen(seed: int) -> None:
    rng = random.Random(seed)
    pts = series(40, lambda i, t: 300 * MIB + 15 * MIB * t + rng.gauss(0, 10 * MIB))
    found = trend(pts, 2048 * MIB)
    assert found is not None
    assert found.rate == pytest.approx(15 * MIB, rel=0.3)


def test_too_short_or_no_limit_tells_nothing() -> None:
    rising = series(40, lambda i, t: 10 * MIB * t)
    assert trend(rising[:12], 1024 * MIB) is None  # 11 s: under the 20 s a floor needs
    assert trend(rising, None) is None
    assert trend(rising, 0) is None
    assert trend([], 1024 * MIB) is None


def test_past_the_limit_the_eta_is_zero() -> None:
    found = trend(series(40, lambda i, t: 10 * MIB * t), 100 * MIB)
    assert found is not None and found.eta_s == 0.0


def test_floors_keep_each_buckets_low_and_high_within_the_window() -> None:
    pts = series(100, lambda i, t: t)
    got = floors(pts, window_s=40.0, buckets=4)
    assert [(lo, hi) for _, lo, hi in got] == [(59.0, 68.0), (69.0, 78.0), (79.0, 88.0), (89.0, 99.0)]
