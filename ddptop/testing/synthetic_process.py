"""Process plumbing of the synthetic job: the RLIMIT_NOFILE check and the generator subprocess.

``run_in_subprocess`` starts ``python -m ddptop.testing.synthetic`` in its own session and returns
once the generator printed its ``ready`` banner (every discovery entry is written by then);
``SyntheticProcess.stop`` kills the whole process group and reaps it.
"""

from __future__ import annotations

import os
import resource
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ddptop.errors import DdptopError, UsageError
from ddptop.proctree import stop_tree
from ddptop.store import discovery


def ensure_fd_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE to cover *needed* fds; UsageError if the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return int(soft)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise UsageError(f"this needs about {needed} open files but the hard limit is {hard} "
                         "(`ulimit -Hn`); use fewer ranks or raise the limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else needed, hard))
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def fds_needed(n_ranks: int, ranks_per_agent: int = 0, rank_servers: bool = True, viewers: int = 0) -> int:
    """Open files a synthetic job needs: per listener itself and one outside viewer's accepted
    connection, plus two per viewer in this process (its accepted connection and its own end).

    Listeners are one per rank (unless agents only) and one per node agent (n/K). At 32,768
    ranks behind agents of 8: 4,096 listeners, 8,256 fds with one outside viewer, against
    73,792 with every rank's own listener too; the hard limit here is 20,000.
    """
    agents = (n_ranks + ranks_per_agent - 1) // ranks_per_agent if ranks_per_agent > 0 else 0
    listeners = (n_ranks if rank_servers else 0) + agents
    return listeners * (2 + 2 * viewers) + 64


class SyntheticProcess:
    """A generator running in its own process group; :meth:`stop` kills the whole group."""

    def __init__(self, proc: subprocess.Popen[bytes], banner: str) -> None:
        self.proc, self.banner = proc, banner

    @property
    def pid(self) -> int:
        """The generator's pid (also the pid in its discovery entries)."""
        return self.proc.pid

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it if it lingers; always reaps."""
        stop_tree(self.proc, grace_s=timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SyntheticProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def run_in_subprocess(n_ranks: int, job_id: str, scenario: str = "healthy", interval_s: float = 1.0,
                      runtime_dir: str | Path | None = None, *, seed: int = 0,
                      extra_args: tuple[str, ...] = (), ready_timeout: float = 120.0) -> SyntheticProcess:
    """Start ``python -m ddptop.testing.synthetic`` in a new session; return once every
    discovery entry is written."""
    env = dict(os.environ)
    if runtime_dir is not None:
        env[discovery.RUNTIME_ENV] = str(runtime_dir)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "ddptop.testing.synthetic", "--ranks", str(n_ranks), "--job-id", job_id,
           "--scenario", scenario, "--interval", str(interval_s), "--seed", str(seed), *extra_args]
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child's stderr
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errors, start_new_session=True)
    handle = SyntheticProcess(proc, "")
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(min(0.5, max(0.0, deadline - time.monotonic()))):
                handle.banner = proc.stdout.readline().decode().strip()
                break
    if not handle.banner.startswith("ready"):
        handle.stop()
        errors.seek(0)
        tail = errors.read().decode(errors="replace")[-2000:]
        errors.close()
        raise DdptopError(f"synthetic job {job_id} did not start within {ready_timeout:g} s: {tail}")
    errors.close()
    return handle
