"""`ddptop demo --no-tui`: the F5 job comes up, its desync is printed, nothing is left running."""

from __future__ import annotations

import re
import subprocess
import time

import psutil
import pytest

from tests.jobs import JobRunner, ddptop_cmd

pytestmark = pytest.mark.slow


def job_processes(job_id: str) -> list[int]:
    """PIDs of processes whose environment names *job_id* (the demo's ranks and launcher)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("DDPTOP_JOB_ID") == job_id:
                found.append(proc.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_demo_no_tui_prints_rows_and_cleans_up(job_runner: JobRunner) -> None:
    # The demo at its own pace, as `make demo` runs it (the suite slows the probes' steps)
    as_a_user = {k: v for k, v in job_runner.env().items() if k != "PROBE_STEP_SLEEP"}
    res = subprocess.run(ddptop_cmd("demo", "--no-tui", "--seconds", "60", "--settle", "2"),
                         env=as_a_user, capture_output=True, text=True, timeout=170, check=False)
    assert res.returncode == 0, res.stderr
    match = re.search(r"job (demo-\w+)", res.stderr)
    assert match, res.stderr
    lines = res.stdout.splitlines()
    rows = [line for line in lines if re.match(r"^\s+\d+ ", line)]
    assert len(rows) == 4, res.stdout
    assert "finding(s)" in res.stdout
    # The demo runs the F5 story (shipped in the package), whose rows flag the batch counts.
    assert "unseeded_split" in res.stderr, res.stderr
    assert any("BATCHES" in row for row in rows), res.stdout
    deadline = time.monotonic() + 15
    while job_processes(match.group(1)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes(match.group(1)) == []
