"""A recording's exit that the node agent could not read (torchrun reaped the process first:
``agent/exits.py``), told by torchrun's own log of the same process.

The node agent reads a rank's wait status from its zombie's ``/proc/PID/stat``; when
torchrun reaps it first the exit is recorded with neither code nor signal, and a rank
SIGKILLed (no last words) would read ``lost``. The job's stderr, kept in the record, holds
torchrun's failure summary (``exitcode : -6 (pid: 754)``): folded over the recording, it
gives that exit its status. The torchrun log is a real one (tests/data/nccl_h100, rank 0
aborted with SIGABRT); the recording is the events the agent writes.
"""

from __future__ import annotations

from pathlib import Path

from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.reader import Contents, build_model, end_time
from ddptop.evidence.fold import fold_evidence
from ddptop.evidence.torchrun_log import read_torchrun_log
from ddptop.protocol import Event, RankExit, RankState, RecordEntry, StateMsg

LOG = Path(__file__).parent / "data" / "nccl_h100" / "torchrun.log"
T = 1_764_108_190.0


def _recording(exit_code: int | None, signal: str, pid: int = 754) -> Contents:
    """Two ranks' last samples, then rank 0's exit as the agent recorded it."""
    events: list[Event] = [
        RecordEntry(time=T, rank=r, message=StateMsg(state=RankState(
            rank=r, local_rank=r, world_size=2, host="localhost", pid=pid + r, job_id="wd", time=T,
            step=60, status="running")))
        for r in (0, 1)]
    events.append(RankExit(time=T + 0.4, rank=0, pid=pid, host="localhost", exit_code=exit_code,
                           signal=signal))
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=T, job_id="wd",
                        world_size=2, ddptop_version="test")
    return Contents(path=Path("/record"), manifest=manifest, events=events)


def _rank0(contents: Contents) -> tuple[str, RankExit | None]:
    model = build_model(contents)
    view = model.ranks[0]
    return model.statuses(end_time(contents))[0], view.exit


def test_an_unknown_exit_takes_torchruns_status_of_the_same_process() -> None:
    failures = read_torchrun_log(LOG)
    assert [(f.rank, f.pid, f.signal) for f in failures] == [(0, 754, "SIGABRT")]
    base = _recording(None, "")
    assert _rank0(base)[0] == "lost"  # the recording alone: reaped before its status was read
    status, exit = _rank0(fold_evidence([], failures, job_id="wd", path=str(LOG), base=base))
    assert status == "crashed" and exit is not None
    assert (exit.pid, exit.exit_code, exit.signal, exit.time) == (754, None, "SIGABRT", T + 0.4)


def test_a_known_exit_and_another_process_s_failure_are_left_as_recorded() -> None:
    failures = read_torchrun_log(LOG)
    status, exit = _rank0(fold_evidence([], failures, job_id="wd", path=str(LOG), base=_recording(1, "")))
    assert status == "crashed" and exit is not None and (exit.exit_code, exit.signal) == (1, "")
    # pid 900: a later incarnation of rank 0 (torchrun restarted it); the log's pid 754 is not it
    later = _recording(None, "", pid=900)
    status, exit = _rank0(fold_evidence([], failures, job_id="wd", path=str(LOG), base=later))
    assert status == "lost" and exit is not None and (exit.exit_code, exit.signal) == (None, "")
