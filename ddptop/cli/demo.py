"""``ddptop demo``: a real 4-rank CPU job with a planted fault, and the dashboard on it.

The job is failure F5 of the catalog (``ddptop/_demo/unseeded_split.py``, shipped in the
package so that the demo works after ``pip install``: an unseeded split
gives ranks different batches per epoch; at the end of the shortest epoch one rank
"saves" with an all_gather while the others sit in DDP's all_reduce). It runs under
``ddptop launch`` in its own process group, and the whole group is killed when the
dashboard quits, also on errors and Ctrl-C, so the demo never leaves processes behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ddptop import auth
from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget, resolve
from ddptop.errors import DdptopError, TargetNotFound, UsageError
from ddptop.model.job import JobModel
from ddptop.proctree import stop_tree

# The package directory from this file, not `import ddptop`: the root facade reaches into the reporter.
DEMO_JOB = Path(__file__).resolve().parent.parent / "_demo" / "unseeded_split.py"
NPROC = 4


def configure(parser: argparse.ArgumentParser) -> None:
    """Add demo's options."""
    parser.add_argument("--no-tui", action="store_true",
                        help="print a snapshot and the findings once ranks are up, then stop the job")
    parser.add_argument("--seconds", type=float, default=300.0, help="how long the job trains at most")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the ranks to appear")
    parser.add_argument("--settle", type=float, default=8.0,
                        help="--no-tui: seconds of live data to gather once every rank trains")


def pick_probe() -> Path:
    """The demo's job (F5, the unseeded split), shipped in the package; UsageError if it is gone."""
    if DEMO_JOB.is_file():
        return DEMO_JOB
    raise UsageError(f"the demo's job is missing from this installation: {DEMO_JOB}")


def _torchrun() -> str:
    here = Path(sys.executable).parent / "torchrun"
    found = str(here) if here.exists() else shutil.which("torchrun")
    if not found:
        raise UsageError("the demo needs torch (torchrun) in this environment: pip install torch")
    return found


def start_job(probe: Path, seconds: float, log_path: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``ddptop launch -- torchrun ... probe`` in a new session; returns (job id, process)."""
    job_id = f"demo-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, PROBE_SECONDS=f"{seconds:g}", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "ddptop", "launch", "--job-id", job_id, "--interval", "0.5", "--",
           _torchrun(), "--standalone", "--nproc-per-node", str(NPROC), str(probe)]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return job_id, proc


def stop_job(proc: subprocess.Popen[bytes]) -> None:
    """Stop the job: its process group and every rank (ranks run in sessions of their own)."""
    stop_tree(proc)


def wait_for_ranks(job_id: str, proc: subprocess.Popen[bytes], timeout: float, log_path: Path) -> JobTarget:
    """Poll discovery until all ranks published an endpoint (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-1500:]
            raise DdptopError(f"the demo job ended early (exit {proc.returncode}):\n{tail}")
        try:
            target = resolve(job_id)
            if len(target.endpoints) >= NPROC:
                return target
        except TargetNotFound:
            pass
        time.sleep(0.5)
    raise DdptopError(f"the demo job's {NPROC} ranks did not appear within {timeout:g}s (log: {log_path})")


def _ready(model: JobModel, now: float) -> bool:
    running = [v for v in model.ranks.values() if v.status(now) == "running" and v.state is not None]
    return len(running) >= NPROC and all(v.state is not None and v.state.step > 0 for v in running)


def print_once(target: JobTarget, wait: float, settle: float) -> None:
    """--no-tui: wait (bounded) until every rank trains, gather *settle* more seconds,
    then print the dashboard's rows (with their desync flags) and the findings."""
    from ddptop.tui.findings import findings
    from ddptop.tui.rows import build_rows, cells, format_line, header_line

    feed = ModelFeed()
    source = LiveSource(target, token=auth.load_token())
    source.start(feed.emit)
    try:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not _ready(feed.copy(), time.time()):
            time.sleep(0.5)
        time.sleep(settle)
    finally:
        source.stop()
    model = feed.copy()
    now = time.time()
    print(f"job {model.job_id}: {model.world_size} ranks")
    print(header_line())
    for row in build_rows(model, now):
        print(format_line(cells(row)))
    found = findings(model, now)
    print(f"\n{len(found)} finding(s)")
    for f in found:
        print(f"{f.severity.upper()}: {f.title} (ranks {f.ranks})")
        for line in f.evidence[:4]:
            print(f"    {line}")


def run(args: argparse.Namespace) -> int:
    """Start the job, attach (or print once), and always kill the job's process group."""
    probe = pick_probe()
    log_path = Path(tempfile.mkdtemp(prefix="ddptop-demo-")) / "job.log"
    job_id, proc = start_job(probe, args.seconds, log_path)
    print(f"ddptop demo: job {job_id} running {probe.name} on {NPROC} CPU ranks (log {log_path})",
          file=sys.stderr)
    try:
        target = wait_for_ranks(job_id, proc, args.wait, log_path)
        if args.no_tui:
            print_once(target, args.wait, args.settle)
        else:
            from ddptop.tui.app import DdptopApp

            DdptopApp(LiveSource(target, token=auth.load_token())).run()
    finally:
        stop_job(proc)
    return 0
