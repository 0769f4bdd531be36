"""Regenerate the recordings behind the dashboard's SVG snapshots (tests/test_tui_snapshots.py).

Runs the real F5 job of the failure catalog (``probes/unseeded_split.py``: an unseeded
split gives the ranks different batches per epoch, and at the end of the shortest epoch
one rank "saves" with an all_gather while the others sit in DDP's all_reduce) on 4 CPU
ranks under ``ddptop launch``, and keeps two files the product itself writes:

    tests/data/f5_hang.ddptop    ``ddptop export`` of the live job a few seconds into the
                                 hang: every rank's state, history, stacks and Flight
                                 Recorder dump (the table, detail, stacks and findings shots)
    tests/data/f5_record.ddptop  ``ddptop export`` of the same job once it has died of its
                                 process-group timeout: the black box of the whole run
                                 (the replay shot's timeline)

Run from the repository root: ``.venv/bin/python tests/data/make_snapshot_recording.py``
(about a minute and a half). A new run is a new job (other times, pids, batch counts), so
the snapshots must then be re-accepted: ``pytest tests/test_tui_snapshots.py --snapshot-update``,
and the new SVGs looked at before they are committed. The files are fixed data: nothing
in the snapshot tests depends on when or where they are read.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ddptop.cli.demo import NPROC, stop_job, wait_for_ranks  # noqa: E402
from ddptop.client.capture import export_bundle, export_record  # noqa: E402
from ddptop.client.live import LiveSource  # noqa: E402
from ddptop.client.targets import resolve  # noqa: E402
from ddptop.diagnosis import findings_for_model  # noqa: E402
from ddptop.model.job import JobModel  # noqa: E402
from ddptop.tui.event_buffer import EventBuffer  # noqa: E402

DATA = Path(__file__).resolve().parent
JOB_ID = "f5-snapshot"  # fixed, so the snapshots do not show a random id
PG_TIMEOUT_S = 40  # the hang lasts this long: time to export in the middle of it
HANG_BEFORE_EXPORT_S = 6.0  # the stuck ranks' ages in the snapshots


def start(log_path: Path) -> subprocess.Popen[bytes]:
    """``ddptop launch -- torchrun`` of the F5 probe, in a session of its own."""
    torchrun = Path(sys.executable).parent / "torchrun"
    env = dict(os.environ, PROBE_SECONDS="120", PROBE_PG_TIMEOUT=str(PG_TIMEOUT_S), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    probe = ROOT / "probes" / "unseeded_split.py"
    cmd = [sys.executable, "-m", "ddptop", "launch", "--job-id", JOB_ID, "--interval", "0.5", "--",
           str(torchrun), "--standalone", "--nproc-per-node", str(NPROC), str(probe)]
    with open(log_path, "wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_mismatch(timeout: float) -> None:
    """Watch the job like the dashboard does until the diagnosis names the collective mismatch
    (the unequal batch counts are critical from the first batch on, long before the hang)."""
    buffer = EventBuffer(lambda: None)
    model = JobModel()
    source = LiveSource(resolve(JOB_ID))
    source.start(buffer.push)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.5)
            for event in buffer.drain():
                model.apply(event)
            found = [f for f in findings_for_model(model, time.time()) if f.kind == "collective_mismatch"]
            if found:
                print(f"diagnosed: {found[0].title}", flush=True)
                return
    finally:
        source.stop()
    raise RuntimeError(f"no collective mismatch within {timeout:g}s (all ranks drew the same split?)")


def main() -> int:
    """Run the job, export it twice (hanging, then dead), always kill what is left of it."""
    runtime = Path(tempfile.mkdtemp(prefix="ddptop-snapdata-"))
    runtime.chmod(0o700)
    os.environ["DDPTOP_RUNTIME_DIR"] = str(runtime)
    log_path = runtime / "job.log"
    proc = start(log_path)
    try:
        wait_for_ranks(JOB_ID, proc, 120, log_path)
        wait_for_mismatch(120)
        time.sleep(HANG_BEFORE_EXPORT_S)
        print(export_bundle(JOB_ID, DATA / "f5_hang.ddptop").line(), flush=True)
        # It dies by itself (the gloo timeout); the launcher closes the record before it exits.
        proc.wait(timeout=PG_TIMEOUT_S + 60)
        print(export_record(resolve(JOB_ID), DATA / "f5_record.ddptop").line(), flush=True)
    finally:
        stop_job(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
