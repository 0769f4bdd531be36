"""Resources running out, foreseen while there is time to act (#48), in real jobs under ``ddptop launch``.

Three jobs at once, one module (one xdist worker), each watched by ``tests/watch_resources.py``
(``ddptop.api.watch``: a look a second, its ``*_exhaustion`` findings printed as they come):

* a rank whose memory grows steadily inside a memory cgroup of the test's own (v1 or v2,
  always removed): warned at least 60 s before the OOM kill, then ``doctor`` says since when
  it was foreseen;
* in a mount namespace of its own, a checkpoint loop filling a 64 MB tmpfs and DataLoader
  workers filling a 128 MB ``/dev/shm``: each warned before its failure;
* a healthy job in a memory cgroup that a warm-up rise would reach in seconds if it went on,
  with a per-step sawtooth and checkpoints that replace each other: no warning, watched from
  the module's start to its end (three minutes and more).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptop.proctree import stop_tree
from tests.cgroups import memory_cgroup
from tests.jobs import BIN, PROBES, ROOT, JobRunner, ddptop_cmd, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("resource-trends")]

HEALTHY_WATCH_S = 180.0


class Watched:
    """A job started in a shell prelude (cgroup, mounts) under ``ddptop launch``, and its watcher."""

    def __init__(self, runner: JobRunner, name: str, env: dict[str, str], prelude: str,
                 unshare: bool = False, seconds: float = 300.0) -> None:
        self.job_id = f"{name}{uuid.uuid4().hex[:6]}"
        self.env = runner.env({"PROBE_SECONDS": str(seconds), **env})
        self.log = runner.tmp / f"{self.job_id}.log"
        self.looks = runner.tmp / f"{self.job_id}.looks"
        torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                    str(PROBES / "resource_growth.py")]
        launch = ddptop_cmd("launch", "--job-id", self.job_id, "--interval", "0.5", "--", *torchrun)
        cmd = ["sh", "-c", f'{prelude} exec "$@"', "sh", *launch]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["unshare", "-m", *cmd] if unshare else cmd, env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        with open(self.looks, "wb") as out:
            self.watcher = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "watch_resources.py"), self.job_id, str(seconds)],
                env=dict(self.env, PYTHONPATH=str(ROOT)), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    def stop(self) -> None:
        stop_tree(self.proc)
        stop_tree(self.watcher)

    def wait(self, timeout: float) -> None:
        self.proc.wait(timeout=timeout)
        self.watcher.wait(timeout=30)

    def seen(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.looks.read_text(errors="replace").splitlines()
                if line.startswith("{")]

    def first(self, kind: str, resource: str = "") -> float | None:
        """Wall clock of the first look with a *kind* finding (of *resource*), None if none."""
        for look in self.seen():
            if any(f[0] == kind and resource in f[4] for f in look["findings"]):
                return float(look["t"])
        return None

    def doctor(self) -> dict[str, Any]:
        res = subprocess.run(ddptop_cmd("doctor", "--json", self.job_id), env=self.env, capture_output=True,
                             text=True, timeout=60, check=False)
        assert "Traceback" not in res.stderr, res.stderr
        doc: dict[str, Any] = json.loads(res.stdout)
        return doc


def _can_unshare() -> str:
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, timeout=30, check=False)
    return "" if probe.returncode == 0 else probe.stderr.strip()[:200]


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobRunner]:
    r = JobRunner(tmp_path_factory.mktemp("resources"))
    yield r
    r.stop_all()


@pytest.fixture(scope="module")
def healthy(runner: JobRunner) -> Iterator[Watched]:
    """Started first, watched while the other jobs run: a warm-up of 300 MB in 10 s under a limit
    about 600 MB above it (reached in 20 s at that pace), a 100 MB sawtooth, rotated checkpoints."""
    with memory_cgroup(2048 << 20) as cg:
        job = Watched(runner, "healthy", {"PROBE_GROW": "healthy", "PROBE_WARMUP_MB": "300",
                                          "PROBE_SAW_MB": "100", "PROBE_CKPT_DIR": str(runner.tmp / "ck-h")},
                      f"echo $$ > {cg / 'cgroup.procs'} &&", seconds=HEALTHY_WATCH_S + 60)
        try:
            yield job
        finally:
            job.stop()


@pytest.fixture(scope="module")
def leak(runner: JobRunner, healthy: Watched) -> Iterator[tuple[Watched, Path]]:
    """Started with the others (the three run at once): rank 1 fills its cgroup's headroom in 150 s.

    A rank is judged from 30 s on, so the earliest warning is about 40 s in; at 120 s the lead
    over the kill was about 72 s against the test's 60, thin on a loaded machine. 150 s ends
    within the healthy job's watch, so the module takes no longer."""
    with memory_cgroup(1536 << 20) as cg:
        job = Watched(runner, "oom", {"PROBE_GROW": "memory", "PROBE_DIE_RANK": "1", "PROBE_FILL_S": "150"},
                      f"echo $$ > {cg / 'cgroup.procs'} &&", seconds=240)
        try:
            yield job, cg
        finally:
            job.stop()


@pytest.fixture(scope="module")
def fill(runner: JobRunner, healthy: Watched) -> Iterator[Watched]:
    """Started with the others: in a mount namespace of its own, checkpoints fill a 64 MB tmpfs in
    about 100 s (then a save fails, and the loop goes on without), and DataLoader workers' cache
    fills a 128 MB /dev/shm in about 130 s (then the rank fails)."""
    why = _can_unshare()
    if why:
        pytest.skip(f"cannot make a mount namespace here: {why}")
    ckpt = runner.tmp / "ckpt-small"
    ckpt.mkdir()
    # The namespace (and its tmpfs mounts) dies with the last process in it: nothing to unmount.
    prelude = f"mount -t tmpfs -o size=128m tmpfs /dev/shm && mount -t tmpfs -o size=64m tmpfs {ckpt} &&"
    job = Watched(runner, "fill", {"PROBE_GROW": "shm_disk", "PROBE_CKPT_DIR": str(ckpt),
                                   "PROBE_CKPT_MB": "1", "PROBE_CKPT_EVERY": "1.5", "PROBE_SHM_KB": "128"},
                  prelude, unshare=True, seconds=240)
    try:
        yield job
    finally:
        job.stop()


# The leak takes 150 s and the three jobs start in this test's set-up: past the suite's 180 s
@pytest.mark.timeout(300)
def test_memory_leak_in_a_cgroup_warned_a_minute_before_the_oom_kill(
        leak: tuple[Watched, Path], fill: Watched) -> None:
    job, cg = leak
    try:
        job.wait(timeout=240)
    finally:
        job.stop()
    kills = cg / ("memory.oom_control" if (cg / "memory.oom_control").exists() else "memory.events")
    assert "oom_kill 0" not in kills.read_text()  # the kernel did kill
    warned = job.first("memory_exhaustion", "cgroup memory")
    lost = next(f for f in job.doctor()["findings"] if f["kind"] == "rank_lost")
    assert lost["ranks"] == [1] and "killed by the OOM killer" in lost["title"], lost
    died = float(lost["since"])
    assert warned is not None, job.seen()[-5:]
    assert died - warned >= 60, (died - warned, job.log.read_text()[-2000:])
    told = [e for e in lost["evidence"] if "foreseen" in e]
    said = r"rank 1's end was foreseen \d+m\d\ds before, at \d\d:\d\d:\d\d: its memory cgroup"
    assert told and re.search(said, told[0]), lost["evidence"]


def test_checkpoints_and_shm_filling_up_warned_before_each_failure(fill: Watched) -> None:
    job = fill
    try:
        job.wait(timeout=240)
    finally:
        job.stop()
    text = job.log.read_text(errors="replace")
    failed = re.search(r"rank 0: checkpoint save failed at t=([\d.]+)", text)
    assert failed, text[-3000:]
    warned_disk = job.first("disk_exhaustion")
    assert warned_disk is not None and warned_disk < float(failed[1]), (warned_disk, failed[1])
    assert "No space left on device" in text and "DataLoader worker" in text, text[-3000:]
    shm = next(f for f in job.doctor()["findings"]
               if f["kind"] == "shm_pressure" and f["severity"] == "critical")
    warned_shm = job.first("shm_exhaustion")
    assert warned_shm is not None and warned_shm < float(shm["since"]), (warned_shm, shm)


def _from_both_ranks(looks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The looks from the first that holds both ranks: the watcher prints from the first rank's
    first state, and on a loaded machine the second can still be importing torch seconds later."""
    both = next((i for i, look in enumerate(looks) if len(look["statuses"]) == 2), len(looks))
    return looks[both:]


# Its watch of HEALTHY_WATCH_S begins with the module's jobs; run first, it would need all of it.
@pytest.mark.timeout(HEALTHY_WATCH_S + 150)
def test_a_healthy_job_is_never_warned(healthy: Watched) -> None:
    def watched_long_enough() -> bool:
        looks = _from_both_ranks(healthy.seen())
        return len(looks) > 1 and looks[-1]["t"] - looks[0]["t"] >= HEALTHY_WATCH_S

    wait_until(watched_long_enough, HEALTHY_WATCH_S + 120,
               f"{HEALTHY_WATCH_S:.0f} s of looks at the healthy job with both its ranks")
    looks = healthy.seen()
    # Both ranks lived through the watch once both were seen: running, or late with a sample
    # (stale) while the suite's other jobs load the machine; never ended.
    watched = _from_both_ranks(looks)
    assert all(look["alive"] == 2 for look in watched), [look for look in watched if look["alive"] != 2][:3]
    # Its own limits only: the host's memory is shared with the leaking job beside it (and with
    # whatever else runs on the machine), whose rise a host forecast rightly reports.
    warned = [look for look in looks if any(f[4] != "host memory" for f in look["findings"])]
    assert not warned, warned[:3]
    assert "healthy" in healthy.job_id
