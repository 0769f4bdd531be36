"""``ddptop.api``: the public Python surface, against real files and a real torchrun job.

Each function must give what its verb's ``--json`` prints (the verbs are printers over it),
import in a fresh interpreter without a UI library or torch, and close what it opened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from ddptop import api
from ddptop.cli.main import main
from ddptop.errors import UsageError
from tests.jobs import JobRunner

ROOT = Path(__file__).resolve().parent.parent
NCCL_H100 = ROOT / "tests" / "data" / "nccl_h100"  # a real NCCL timeout's logs
PUBLIC = {"DdptopError", "Evidence", "ExportSummary", "Finding", "FindingsReport", "JobEntry", "JobSnapshot",
          "OutcomeEntry", "RankState", "Target", "Update", "diagnose", "export", "jobs", "read_evidence",
          "snapshot", "watch"}


def test_the_api_imports_alone_without_a_ui_or_torch() -> None:
    """A fresh interpreter: ``ddptop.api`` and every name of ``__all__`` import, and neither
    textual (the dashboard) nor torch comes with them (a login node or a notebook has neither)."""
    code = ("import sys, json; from ddptop import api; "
            "missing = [n for n in api.__all__ if not hasattr(api, n)]; "
            "print(json.dumps({'all': sorted(api.__all__), 'missing': missing, "
            "'loaded': sorted(m for m in ('textual', 'torch') if m in sys.modules)}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=env, check=False)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc["all"]) == PUBLIC and not doc["missing"] and not doc["loaded"], doc


def test_diagnose_files_is_what_doctor_json_prints(capsys: pytest.CaptureFixture[str]) -> None:
    report = api.diagnose(NCCL_H100)
    assert isinstance(report, api.FindingsReport)
    assert main(["doctor", "--json", str(NCCL_H100)]) == 1  # a collective stall: warning or worse
    printed = msgspec.json.decode(capsys.readouterr().out.encode(), type=api.FindingsReport)
    assert printed == report
    assert report.ranks_seen > 0 and any(f.kind == "collective_stall" for f in report.findings)


def test_read_evidence_gives_states_findings_and_warnings() -> None:
    evidence = api.read_evidence(NCCL_H100)
    assert evidence.findings == api.diagnose(NCCL_H100)
    assert evidence.snapshot.job.world_size == evidence.findings.ranks_seen
    assert {s.rank for s in evidence.snapshot.ranks} <= set(range(evidence.snapshot.job.world_size))
    assert isinstance(evidence.warnings, list)


def test_bad_paths_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file or folder") as raised:
        api.read_evidence(tmp_path / "nothing-here")
    assert raised.value.exit_code == 2 and "\n" not in str(raised.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(api.DdptopError):
        api.diagnose(empty)
    with pytest.raises(UsageError):
        api.export([], tmp_path / "out.ddptop")


def _live_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ddptop-live"]


def test_a_live_job_then_its_record_through_the_api(job_runner: JobRunner, tmp_path: Path) -> None:
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "25"})
    job.wait_ranks(2, timeout=60)

    (entry,) = [e for e in api.jobs() if e.job_id == job.job_id]
    assert entry.state == "running" and entry.alive == 2 and entry.world_size == 2

    snap = api.snapshot(job.job_id, timeout=10)
    assert sorted(s.rank for s in snap.ranks) == [0, 1] and not snap.job.unreachable

    report = api.diagnose(job.job_id, watch=10)
    assert report.job_id == job.job_id and report.ranks_seen == 2
    assert not [f for f in report.findings if f.at_least("warning")], report.findings

    updates = api.watch(job.job_id, every=0.2, timeout=10)
    first, second = next(updates), next(updates)
    assert second.snapshot.job.time > first.snapshot.job.time and len(second.snapshot.ranks) == 2
    assert _live_threads(), "a watch holds its connections while iterated"
    updates.close()  # the caller stops: the connections close
    deadline = time.monotonic() + 10
    while _live_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _live_threads(), "watch left its live source running after close()"

    summary = api.export(job.job_id, tmp_path / "live.ddptop", timeout=10)
    assert summary.path.exists() and sorted(summary.answered) == [0, 1]

    assert job.proc.wait(timeout=90) == 0  # the probe ends by itself
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # its node agent closes the job record
        (entry,) = [e for e in api.jobs() if e.job_id == job.job_id]
        if entry.state == "ended":
            break
        time.sleep(0.1)
    assert entry.state == "ended" and sorted(o.rank for o in entry.outcome) == [0, 1], entry
    assert api.jobs(include_unrecorded=True)
    ended = api.snapshot(job.job_id)
    assert {s.status for s in ended.ranks} == {"exited"}, ended.ranks
    assert not [f for f in api.diagnose(job.job_id).findings if f.at_least("warning")]
    (last,) = list(api.watch(job.job_id))  # an ended job: one last look
    assert last.snapshot.job.id == job.job_id
