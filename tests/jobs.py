"""Real torchrun jobs for tests: started under `ddptop launch`, owned, always reaped.

Each job runs in its own session (process group); ``stop()`` kills the whole group, and
the ``job_runner`` fixture stops every job it started even when a test fails. Every
wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddptop.proctree import stop_tree
from tests.story_check import assert_one_story_json

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "probes"
BIN = Path(sys.executable).parent


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll *predicate* until it holds; fail naming *what* after *timeout* seconds.

    A predicate that runs a ddptop verb (a process, an import, a look at the job) is given a
    pause of half its own time before the next call: back to back such polls kept a core busy
    beside the job they waited on, on a 2-core machine whose suite is bound by CPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        began = time.monotonic()
        if predicate():
            return
        time.sleep(max(0.05, min(1.0, (time.monotonic() - began) / 2)))
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def ddptop_cmd(*args: str) -> list[str]:
    """Command line running the ddptop CLI of this checkout."""
    return [sys.executable, "-m", "ddptop", *args]


def alone_on_host(argv: list[str]) -> list[str]:
    """*argv* run in a PID namespace of its own, with its own /proc.

    A viewer looks for jobs in other mount namespaces through /proc (#22), so a test that
    asserts "no job here" would see another test's job in a private /tmp, run in parallel.
    Its own /proc shows the command nothing but itself. Root gets the namespace directly,
    another user through a user namespace; where neither can, the command runs as it is
    (then no test of this suite can make such a job either: private /tmp needs root)."""
    for prefix in (["unshare", "--pid", "--fork", "--mount-proc"],
                   ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return [*prefix, *argv]
    return argv


@dataclass
class RunningJob:
    """A `ddptop launch -- torchrun ...` job started by a test."""

    job_id: str
    proc: subprocess.Popen[bytes]
    runtime_dir: Path
    log_path: Path
    env: dict[str, str]
    started: float = field(default_factory=time.monotonic)

    def run_cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a ddptop verb against this job's runtime dir (bounded); the findings of
        `doctor --json` are held to the one-story property (tests/story_check.py)."""
        res = subprocess.run(ddptop_cmd(*args), env=self.env, capture_output=True, text=True,
                             timeout=timeout, check=False)
        if args[:1] == ("doctor",) and "--json" in args:
            assert_one_story_json(res.stdout)
        return res

    def snapshot(self, timeout: float = 30.0) -> dict[str, Any]:
        """`ddptop snapshot --json JOB` parsed (raises with stderr if it printed nothing)."""
        res = self.run_cli("snapshot", "--json", self.job_id, timeout=timeout)
        if not res.stdout.strip():
            raise AssertionError(f"snapshot printed nothing (rc {res.returncode}): {res.stderr}")
        return dict(json.loads(res.stdout))

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0,
                 interval: float = 0.5) -> dict[str, Any]:
        """Poll snapshots until *predicate(snapshot)* holds; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                last = self.snapshot()
                if predicate(last):
                    return last
            except (AssertionError, json.JSONDecodeError, subprocess.TimeoutExpired):
                pass
            if self.proc.poll() is not None and not last:
                break
            time.sleep(interval)
        raise AssertionError(f"condition not met within {timeout}s; last snapshot: "
                             f"{json.dumps(last)[:2000]}\nlog:\n{self.log()[-3000:]}")

    def wait_ranks(self, n: int, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until *n* ranks answer with a started training loop."""
        return self.wait_for(lambda s: sum(1 for r in s["ranks"] if r["status"] == "running") >= n,
                             timeout)

    def log(self) -> str:
        """What the job printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Wait (bounded) until the job's output matches *pattern*; the match."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = rx.search(self.log())
            if m:
                return m
            if self.proc.poll() is not None:
                m = rx.search(self.log())
                if m:
                    return m
                break
            time.sleep(0.1)
        raise AssertionError(f"the job never printed {pattern!r} within {timeout}s:\n{self.log()[-3000:]}")

    def wait_log_all(self, pattern: str, count: int, timeout: float = 60.0) -> list[tuple[str, ...]]:
        """Wait (bounded) until *pattern* matches *count* times in the job's output; the groups."""
        self.wait_log(pattern, timeout=timeout)
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            found = [m.groups() for m in rx.finditer(self.log())]
            if len(found) >= count or time.monotonic() >= deadline or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        assert len(found) >= count, f"{pattern!r}: {len(found)} matches, not {count}:\n{self.log()[-3000:]}"
        return found

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the job to end by itself (bounded); return its exit code."""
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Stop the job's process group and every rank it started (idempotent)."""
        stop_tree(self.proc)


def held_snapshot(job: RunningJob, release: Path, nproc: int, timeout: float) -> dict[str, Any]:
    """Wait for every rank's hold marker (``<release>.held<rank>``, holding the moment it was
    written), then return a snapshot sampled after the last one."""
    markers = [Path(f"{release}.held{r}") for r in range(nproc)]
    deadline = time.monotonic() + timeout
    while not all(m.exists() for m in markers):
        if job.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"ranks did not finish training (rc {job.proc.poll()}):\n"
                                 f"{job.log()[-4000:]}")
        time.sleep(0.2)
    held_at = max(float(m.read_text() or 0) for m in markers)
    return job.wait_for(lambda s: len(s["ranks"]) == nproc and all(r["time"] > held_at for r in s["ranks"]),
                        timeout=30, interval=0.3)


class JobRunner:
    """Starts probe jobs for one test and stops them all at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.runtime_dir = tmp / "rt"
        self.runtime_dir.mkdir(mode=0o700, exist_ok=True)
        self.jobs: list[RunningJob] = []

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for jobs and CLI calls of this test (private runtime dir)."""
        env = dict(os.environ)
        env.update({"DDPTOP_RUNTIME_DIR": str(self.runtime_dir), "PYTHONUNBUFFERED": "1",
                    "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
        env.update(extra or {})
        return env

    def start(self, probe: str, nproc: int = 4, env: dict[str, str] | None = None,
              interval: float = 0.25, args: list[str] | None = None,
              launch_args: list[str] | None = None, launcher: bool = True) -> RunningJob:
        """Start ``ddptop launch -- torchrun --nproc-per-node N probes/<probe>.py``.

        With ``launcher=False``: plain ``torchrun`` running the probe through
        ``tests/install_runner.py``, which calls ``ddptop.install()`` first (no launcher:
        local rank 0 spawns the node agent).
        """
        job_id = f"t{uuid.uuid4().hex[:8]}"
        full_env = self.env({"PROBE_SECONDS": "60", **(env or {})})
        log_path = self.tmp / f"{job_id}.log"
        torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc)]
        script = [str(PROBES / f"{probe}.py"), *(args or [])]
        if launcher:
            cmd = ddptop_cmd("launch", "--job-id", job_id, "--interval", str(interval),
                             *(launch_args or []), "--", *torchrun, *script)
        else:
            paths = [str(ROOT), full_env.get("PYTHONPATH", "")]
            full_env.update(DDPTOP_JOB_ID=job_id, DDPTOP_INTERVAL=str(interval),
                            PYTHONPATH=os.pathsep.join(p for p in paths if p))
            cmd = [*torchrun, str(ROOT / "tests" / "install_runner.py"), *script]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        job = RunningJob(job_id=job_id, proc=proc, runtime_dir=self.runtime_dir,
                         log_path=log_path, env=full_env)
        self.jobs.append(job)
        return job

    def stop_all(self) -> None:
        """Stop every job this runner started."""
        for job in self.jobs:
            job.stop()
