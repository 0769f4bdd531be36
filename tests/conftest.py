"""Shared fixtures: real jobs, generators and viewers, always cleaned up; private runtime directories."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from ddptop.testing.synthetic import SyntheticProcess
from tests.hermetic import SESSION_ENV, SessionDirs
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
    # Hermetic (#49): the session's own runtime directory and a watched trap where the
    # machine's default would be, made once by the controller; xdist's workers and every
    # process a test starts inherit them (tests/hermetic.py).
    if SESSION_ENV not in os.environ:
        config.stash[_SESSION_DIRS] = SessionDirs.start()
    # Ranks and viewers started by tests must never pick up a developer's token.
    os.environ.pop("DDPTOP_TOKEN", None)
    # The probes' pace between steps (ddptop/_demo/train_common.step_sleep: 0.02 s, kept for
    # the demo): at 0.02 a two-rank job used 0.37 of a core while it trained, at 0.05 it uses
    # 0.15, and the suite runs a job on every worker at once on two cores. A test whose story
    # needs another pace sets PROBE_STEP_SLEEP itself.
    os.environ.setdefault("PROBE_STEP_SLEEP", "0.05")
    # pytest-textual-snapshot writes its HTML report of failed snapshots into the current
    # directory (the checkout) unless told otherwise: send it to the temp dir instead.
    if config.getoption("--snapshot-report", None) == SNAPSHOT_REPORT_DEFAULT:
        report = Path(tempfile.gettempdir()) / f"ddptop-snapshot-report-{os.getuid()}.html"
        config.option.snapshot_report = str(report)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Real jobs first (marker "slow"), the short tests after: xdist hands out tests in this order,
    # and the short ones then fill the workers' last minutes, where a job of a minute or three
    # (tests/test_resource_e2e.py) left at the end held the whole run for it. Stable: the order
    # within each kind is the files' own.
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)


_SESSION_DIRS = pytest.StashKey[SessionDirs]()
_HERMETIC_FAILURES = pytest.StashKey[tuple[list[str], list[str]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    dirs = session.config.stash.get(_SESSION_DIRS, None)
    if dirs is None:
        return
    failures, warnings = dirs.finish()
    session.config.stash[_HERMETIC_FAILURES] = (failures, warnings)
    if failures and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    failures, warnings = terminalreporter.config.stash.get(_HERMETIC_FAILURES, ([], []))
    if failures:
        terminalreporter.section("not hermetic: a test read or wrote the default runtime directory",
                                 red=True)
        for line in failures[:50]:
            terminalreporter.line(line)
        terminalreporter.line("the session fails: give the process a runtime directory of its own (the "
                              "runtime_dir or job_runner fixture, or DDPTOP_RUNTIME_DIR in its environment)")
    for line in warnings[:10]:
        terminalreporter.line(f"warning: written while the suite ran, not by it: {line}")


# Property tests: repeatable in CI (derandomized, no example database), no deadline on a
# shared 2-core machine (a slow example is not a failure). No explain phase: on Python 3.11 it
# traces every line of a failing example, and a diagnosis traced that way ran past the test
# timeout, so a real counterexample was reported as a timeout and "flaky data generation".
# The examples are the same under every PYTHONHASHSEED; the diagnosis of one may not be (a set's
# order), so a property that holds under one hash seed is checked under others by
# `make hashseeds`.
settings.register_profile("ddptop", derandomize=True, database=None, deadline=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ddptop")
