"""The suite is hermetic (#49): no test reads or writes the machine's default runtime directory.

tests/hermetic.py gives the session its own ``DDPTOP_RUNTIME_DIR`` and a watched trap where the
default would be (``XDG_RUNTIME_DIR``); the session fails if anything touched the trap. These
tests show the watch sees what it must (a real ``ddptop`` process that falls back to the
default directory, reading and writing) and nothing when a directory is named, and that this
session runs inside its own directories.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ddptop.store import discovery
from tests.hermetic import IN_ACCESS, IN_CREATE, IN_MOVED_TO, IN_OPEN, SESSION_ENV, Watch, machine_default_dir
from tests.jobs import ddptop_cmd


def _trap(tmp_path: Path) -> tuple[Path, Watch]:
    xdg = tmp_path / "xdg"
    (xdg / "ddptop").mkdir(mode=0o700, parents=True)
    watch = Watch(xdg / "ddptop", IN_OPEN | IN_ACCESS | IN_CREATE | IN_MOVED_TO)
    assert watch.watching, "inotify is not available"
    return xdg, watch


def _env(**names: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DDPTOP_RUNTIME_DIR", "XDG_RUNTIME_DIR")}
    env.update(names)
    return env


def test_the_watch_sees_a_process_that_reads_the_default_directory(tmp_path: Path) -> None:
    xdg, watch = _trap(tmp_path)
    try:
        res = subprocess.run(ddptop_cmd("jobs", "--all", "--json"), env=_env(XDG_RUNTIME_DIR=str(xdg)),
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        assert ". opened" in watch.events(), "a listing of the default directory went unseen"
    finally:
        watch.close()


def test_the_watch_sees_a_rank_that_writes_there(tmp_path: Path) -> None:
    xdg, watch = _trap(tmp_path)
    code = ("from ddptop.store import discovery\n"
            "from ddptop.store.discovery import Endpoint\n"
            "discovery.write_entry(Endpoint(job_id='j', rank=0, world_size=1, host='h', port=1, pid=1))\n")
    try:
        subprocess.run([sys.executable, "-c", code], env=_env(XDG_RUNTIME_DIR=str(xdg)), timeout=60,
                       check=True)
        assert "j.0.json moved in" in watch.events()
    finally:
        watch.close()


def test_the_watch_sees_nothing_when_the_directory_is_named(tmp_path: Path) -> None:
    xdg, watch = _trap(tmp_path)
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    try:
        res = subprocess.run(ddptop_cmd("jobs", "--all", "--json"),
                             env=_env(XDG_RUNTIME_DIR=str(xdg), DDPTOP_RUNTIME_DIR=str(own)),
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stderr
        assert watch.events() == []
    finally:
        watch.close()


def test_this_session_runs_in_its_own_directories() -> None:
    root = Path(os.environ[SESSION_ENV])
    assert discovery.runtime_dir(create=False).is_relative_to(root)
    assert machine_default_dir().is_relative_to(root), "a process that drops DDPTOP_RUNTIME_DIR would " \
        "fall back to the machine's default directory"
