"""Foresight for real habits (#55), in real jobs under ``ddptop launch`` (gloo, CPU), all at once.

* checkpoints of 40 MB kept, every 25 s and every 60 s, on a 300 MB tmpfs (a mount namespace
  of the job's own) known to ddptop only from ``torch.save``: the 8th does not fit and ends
  rank 0. Warned at least 60 s before, in every ``doctor`` call from the first warning to the
  death; after it, the end told as the full disk and "foreseen ... before" naming it;
* the same saves rotated (the last 2 kept): no disk warning in 3 minutes;
* rank 1 moved into a 1.5 GiB memory cgroup after it started, leaking 10 MB/s: warned at
  least 60 s before the OOM kill; the post-mortem names that cgroup and its limit;
* a healthy job beside a process growing the host's memory 40 MB/s (up to 6 GB): no finding
  names the job's ranks as the growth; a host memory warning says the growth is elsewhere.

Minutes of wall time (the 60 s spacing's death comes 8 minutes in): ``make test-long``; the
logic each relies on is covered fast in tests/test_disk_steps.py, tests/test_reporter_resources.py
and tests/test_diagnosis_resources.py. Each test prints what it measured (``-s``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptop.proctree import stop_tree
from tests.cgroups import memory_cgroup
from tests.jobs import JobRunner
from tests.test_resource_e2e import Watched, _can_unshare

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.xdist_group("resource-habits")]

DISK_MB = 300
HOG = """
import time
kept = []
while sum(map(len, kept)) < 6 << 30:
    b = bytearray(40 << 20)
    b[::4096] = b"x" * len(b[::4096])
    kept.append(b)
    time.sleep(1.0)
time.sleep(3600)
"""


class DoctorCalls:
    """``ddptop doctor --json`` called over and over on a job (one at a time) until stopped."""

    def __init__(self, job: Watched, pause: float = 2.0) -> None:
        self.job, self.pause = job, pause
        self.calls: list[tuple[float, dict[str, Any]]] = []  # (when the call started, its JSON)
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.time()
            try:
                self.calls.append((started, self.job.doctor()))
            except (AssertionError, json.JSONDecodeError, subprocess.TimeoutExpired) as exc:
                self.failed.append(f"{started:.0f}: {exc!r}"[:300])  # not started yet, or ending
            self._stop.wait(self.pause)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


def _saving(runner: JobRunner, name: str, every: float, keep: int, seconds: float) -> Watched:
    ckpt = runner.tmp / f"ck-{name}"
    ckpt.mkdir()
    # The namespace (and its tmpfs) dies with the last process in it: nothing to unmount.
    return Watched(runner, name, {"PROBE_GROW": "disk", "PROBE_CKPT_DIR": str(ckpt), "PROBE_CKPT_MB": "40",
                                  "PROBE_CKPT_EVERY": str(every), "PROBE_CKPT_KEEP": str(keep)},
                   f"mount -t tmpfs -o size={DISK_MB}m tmpfs {ckpt} &&", unshare=True, seconds=seconds)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobRunner]:
    r = JobRunner(tmp_path_factory.mktemp("habits"))
    yield r
    r.stop_all()


@pytest.fixture(scope="module")
def jobs(runner: JobRunner) -> Iterator[dict[str, Any]]:
    """The five jobs, started at once: the module lasts as long as its longest (the 60 s saves)."""
    why = _can_unshare()
    if why:
        pytest.skip(f"cannot make a mount namespace here: {why}")
    started: dict[str, Any] = {}
    hog: subprocess.Popen[bytes] | None = None
    with memory_cgroup(1536 << 20) as cg:
        try:
            started["every25"] = _saving(runner, "every25", 25.0, 0, 420)
            started["every60"] = _saving(runner, "every60", 60.0, 0, 720)
            started["rotated"] = _saving(runner, "rotated", 25.0, 2, 220)
            started["moved"] = Watched(runner, "moved", {"PROBE_GROW": "memory", "PROBE_DIE_RANK": "1",
                                                        "PROBE_LEAK_MBS": "10"}, "", seconds=420)
            started["cgroup"] = cg
            threading.Thread(target=_move_when_leaking, args=(started["moved"], cg, started),
                             daemon=True).start()
            started["healthy"] = Watched(runner, "beside", {"PROBE_GROW": "healthy",
                                                            "PROBE_CKPT_DIR": str(runner.tmp / "ck-b")},
                                         "", seconds=240)
            hog = subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True)
            started["doctors"] = {name: DoctorCalls(started[name]) for name in ("every25", "every60")}
            yield started
        finally:
            for calls in started.get("doctors", {}).values():
                calls.stop()
            for job in started.values():
                if isinstance(job, Watched):
                    job.stop()
            if hog is not None:
                stop_tree(hog)


def _move_when_leaking(job: Watched, cg: Path, into: dict[str, Any]) -> None:
    """Rank 1 of *job* moved into *cg* once it says it leaks (its first cgroup has no limit)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        pid = re.search(r"rank 1: leaking .* \(pid (\d+)\)", job.log.read_text(errors="replace"))
        if pid:
            (cg / "cgroup.procs").write_text(pid[1])
            into["moved_at"] = time.time()
            return
        time.sleep(0.5)


def _failed_at(job: Watched) -> float:
    found = re.search(r"rank 0: checkpoint save failed at t=([\d.]+)", job.log.read_text(errors="replace"))
    assert found, job.log.read_text(errors="replace")[-3000:]
    return float(found[1])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["every25", "every60"])
def test_kept_checkpoints_warned_a_minute_before_in_every_doctor_call(jobs: dict[str, Any],
                                                                      name: str) -> None:
    job: Watched = jobs[name]
    job.wait(timeout=840)
    calls: DoctorCalls = jobs["doctors"][name]
    calls.stop()
    failed = _failed_at(job)
    before = [(t, doc) for t, doc in calls.calls if t < failed - 2]  # started before the death
    warned = [t for t, doc in before if any(f["kind"] == "disk_exhaustion" for f in doc["findings"])]
    assert warned, [doc["findings"] for _, doc in before[-3:]]
    since = [(t, any(f["kind"] == "disk_exhaustion" for f in doc["findings"])) for t, doc in before
             if t >= warned[0]]
    lost = next(f for f in job.doctor()["findings"] if f["kind"] == "rank_lost")
    told = [e for e in lost["evidence"] if "foreseen" in e]
    looked = job.first("disk_exhaustion") or failed
    print(f"\nMEASURED {name}: save failed at {failed:.1f}, first doctor warning {failed - warned[0]:.0f} s "
          f"before ({len(warned)} of {len(since)} calls from it held it); first look warned "
          f"{failed - looked:.0f} s before; post-mortem: {lost['title']!r}; {told}", flush=True)
    assert all(held for _, held in since), since
    assert failed - warned[0] >= 60
    assert "the checkpoint disk" in lost["title"] and lost["ranks"][0] == 0, lost
    said = r"foreseen \d+m\d\ds before, at \d\d:\d\d:\d\d: its checkpoint disk \(/"
    assert told and re.search(said, told[0]), lost["evidence"]


@pytest.mark.timeout(400)
def test_rotated_checkpoints_never_warned(jobs: dict[str, Any]) -> None:
    job: Watched = jobs["rotated"]
    job.wait(timeout=360)
    looks = [look for look in job.seen() if look["running"] == 2]
    saves = len(re.findall(r"rank 0: saved at", job.log.read_text(errors="replace")))
    disk = [look for look in looks if any(f[0] == "disk_exhaustion" for f in look["findings"])]
    span = looks[-1]["t"] - looks[0]["t"]
    print(f"\nMEASURED rotated: {len(looks)} looks over {span:.0f} s, {saves} saves, "
          f"{len(disk)} with a disk warning", flush=True)
    assert looks[-1]["t"] - looks[0]["t"] >= 180 and saves >= 7
    assert not disk, disk[:3]


@pytest.mark.timeout(600)
def test_a_rank_moved_into_a_memory_cgroup_after_its_start_warned_before_the_oom_kill(
        jobs: dict[str, Any]) -> None:
    job: Watched = jobs["moved"]
    cg: Path = jobs["cgroup"]
    job.wait(timeout=400)
    moved_at = jobs.get("moved_at")
    assert moved_at is not None, job.log.read_text(errors="replace")[-2000:]
    lost = next(f for f in job.doctor()["findings"] if f["kind"] == "rank_lost")
    died = float(lost["since"])
    warned = job.first("memory_exhaustion", "cgroup memory")
    told = [e for e in lost["evidence"] if "foreseen" in e]
    print(f"\nMEASURED moved: moved at +0, killed at +{died - moved_at:.0f} s, first warning "
          f"{died - warned if warned else float('nan'):.0f} s before the kill; "
          f"post-mortem: {lost['title']!r}; {told}", flush=True)
    assert lost["ranks"] == [1] and "killed by the OOM killer" in lost["title"], lost
    assert f"the cgroup limit 1.5G of /{cg.name}" in lost["title"], lost["title"]
    assert warned is not None and died - warned >= 60


@pytest.mark.timeout(400)
def test_a_host_memory_hog_is_not_blamed_on_a_healthy_job(jobs: dict[str, Any]) -> None:
    job: Watched = jobs["healthy"]
    job.wait(timeout=360)
    looks = [look for look in job.seen() if look["running"] == 2]
    host = [f for look in looks for f in look["findings"] if f[4] == "host memory"]
    blamed = [f for look in looks for f in look["findings"] if f[2]]
    print(f"\nMEASURED hog: {len(looks)} looks, {len(host)} host-memory findings "
          f"({host[-1][5] if host else 'none'!r}), {len(blamed)} naming ranks", flush=True)
    assert len(looks) >= 60
    assert not blamed, blamed[:3]
    assert all("other processes" in f[5] for f in host), host[:3]
