"""Shared fixtures: real jobs, generators and viewers, always cleaned up; private runtime directories."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from ddptop.testing.synthetic import SyntheticProcess
from tests.jobs import JobRunner
from tests.story_check import checked
from tests.watched import Watched


@pytest.fixture(autouse=True)
def _one_story_in_every_diagnosis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every diagnosis made in a test's process tells one story (tests/story_check.py)."""
    from ddptop.diagnosis import engine

    monkeypatch.setattr(engine, "one_story", checked(engine.one_story))

SNAPSHOT_REPORT_DEFAULT = "snapshot_report.html"  # pytest-textual-snapshot's --snapshot-report


@pytest.fixture
def via_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Viewers reach the ranks through their node agents (DDPTOP_VIA=agent)."""
    monkeypatch.setenv("DDPTOP_VIA", "agent")


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private DDPTOP_RUNTIME_DIR for this test (in-process code sees it too)."""
    path = tmp_path / "rt"
    path.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("DDPTOP_RUNTIME_DIR", str(path))
    return path


@pytest.fixture
def job_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobRunner]:
    """Start real `ddptop launch -- torchrun` jobs; all are killed at teardown."""
    runner = JobRunner(tmp_path)
    monkeypatch.setenv("DDPTOP_RUNTIME_DIR", str(runner.runtime_dir))
    try:
        yield runner
    finally:
        runner.stop_all()


@pytest.fixture
def watch() -> Iterator[Callable[..., Watched]]:
    """Start viewers: ``watch(job_id, digest=False)``; every one is stopped after the test."""
    started: list[Watched] = []

    def start(job_id: str, digest: bool = False) -> Watched:
        w = Watched(job_id, digest)
        started.append(w)
        w.source.start(w.emit)
        return w

    try:
        yield start
    finally:
        for w in started:
            w.source.stop()


@pytest.fixture
def generators() -> Iterator[list[SyntheticProcess]]:
    """Subprocess generators a test started: each stopped (its process group killed) after."""
    started: list[SyntheticProcess] = []
    try:
        yield started
    finally:
        for gen in started:
            gen.stop()


def pytest_configure(config: pytest.Config) -> None:
    # Ranks and viewers started by tests must never pick up a developer's token.
    os.environ.pop("DDPTOP_TOKEN", None)
    # pytest-textual-snapshot writes its HTML report of failed snapshots into the current
    # directory (the checkout) unless told otherwise: send it to the temp dir instead.
    if config.getoption("--snapshot-report", None) == SNAPSHOT_REPORT_DEFAULT:
        report = Path(tempfile.gettempdir()) / f"ddptop-snapshot-report-{os.getuid()}.html"
        config.option.snapshot_report = str(report)


# Property tests: repeatable in CI (derandomized, no example database), no deadline on a
# shared 2-core machine (a slow example is not a failure).
settings.register_profile("ddptop", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ddptop")
