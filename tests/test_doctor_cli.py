"""`ddptop doctor` end to end: a real small job, JSON shape, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import msgspec
import pytest

from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.writer import BundleWriter
from ddptop.cli.main import main
from ddptop.diagnosis import KINDS, FindingsReport
from ddptop.protocol import RankState, RecordEntry, StateMsg
from tests.jobs import JobRunner, ddptop_cmd

FIELDS = {"kind", "severity", "ranks", "title", "evidence", "remedy"}


def test_doctor_healthy_job_json_and_table_exit_0(job_runner: JobRunner) -> None:
    """One healthy job, read as JSON and as the table (a job each cost the suite 13 CPU-s)."""
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "60"})
    job.wait_ranks(2, timeout=60)
    res = job.run_cli("doctor", "--json", "--watch", "5", job.job_id, timeout=60)
    assert res.returncode == 0, f"rc {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    doc = json.loads(res.stdout)
    assert set(doc) >= {"findings"}
    assert doc["job_id"] == job.job_id
    for f in doc["findings"]:  # only info-level findings may appear on a healthy job
        assert set(f) >= FIELDS and f["kind"] in KINDS and f["severity"] == "info"
    msgspec.json.decode(res.stdout.encode(), type=FindingsReport)

    res = job.run_cli("doctor", "--watch", "3", job.job_id, timeout=60)
    assert res.returncode == 0, res.stderr
    # The healthy probe does not seed numpy: an info-level rng_divergence may be listed.
    assert f"job {job.job_id}" in res.stdout and "severity" in res.stdout
    assert "warning" not in res.stdout and "critical" not in res.stdout


def test_doctor_no_job_exit_2(runtime_dir: Path) -> None:
    res = subprocess.run(ddptop_cmd("doctor", "--json", "nosuchjob"), capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 2
    assert res.stderr.startswith("ddptop: ") and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_doctor_bad_watch_exit_2(runtime_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--watch", "-1"]) == 2
    assert "--watch" in capsys.readouterr().err


def _state(rank: int, batches: int) -> RankState:
    return RankState(rank=rank, local_rank=rank, world_size=3, host="h", pid=1 + rank, job_id="rec",
                     time=100.0, start_time=1.0, batches_per_epoch=batches)


def _recording(path: Path, counts: list[int]) -> Path:
    """A real recording (the writer `ddptop record` uses) of ranks with these batch counts."""
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=99.0, job_id="rec",
                        world_size=len(counts), ddptop_version="test")
    writer = BundleWriter(path, manifest)
    for r, n in enumerate(counts):
        writer.write(RecordEntry(time=100.0, rank=r, message=StateMsg(state=_state(r, n))))
    writer.close("test")
    return path


def test_doctor_exit_1_and_json_on_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _recording(tmp_path / "rec.ddptop", [1250, 1248, 1250])
    assert main(["doctor", "--json", str(path)]) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert [f["kind"] for f in doc["findings"]] == ["unequal_batches"]
    assert doc["findings"][0]["ranks"] == [1] and set(doc["findings"][0]) >= FIELDS
    assert "unequal_batches" in out.err


def test_doctor_file_target_healthy_and_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _recording(tmp_path / "ok.ddptop", [1250, 1250, 1250])
    assert main(["doctor", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
    bad = tmp_path / "bad.ddptop"
    bad.write_bytes(b"DDPTOP\x00\x63garbage")
    assert main(["doctor", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddptop: ") and "Traceback" not in err
