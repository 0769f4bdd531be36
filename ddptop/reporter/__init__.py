"""The rank-side reporter. Never imports textual, rich or any viewer module.

:func:`install` is called by ``ddptop launch``'s ``sitecustomize`` in every rank, or by
the user. It starts the agent thread at once and patches torch as soon as torch is
imported (right away if it already is), so nothing the training script constructs
escapes the hooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from ddptop.reporter.torch_import import when_imported

_lock = threading.Lock()
_reporter: object | None = None
OWNER_ENV = "DDPTOP_OWNER_PID"
AGENT_ENV = "DDPTOP_AGENT_PID"  # set by `ddptop launch`, which is the node agent itself
RANK_VARS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE")


def spawn_node_agent(job_id: str) -> None:
    """Start the node agent that keeps this job's black box (no launcher here to do it).

    ``python -m ddptop.agent`` in a session of its own: it outlives the ranks, sees their
    exits and ends by itself when they are gone. Failure only costs the record.
    """
    if os.environ.get("DDPTOP_RECORD_MB", "").strip() in ("0", "0.0"):
        return
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env[AGENT_ENV] = "spawned"
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    try:
        subprocess.Popen([sys.executable, "-m", "ddptop.agent", "--job-id", job_id,
                          "--rank-pid", str(os.getpid())], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError as exc:
        print(f"ddptop: no black box for this job: {exc}", file=sys.stderr)


def is_rank_process(env: dict[str, str] | None = None) -> bool:
    """True in a torchrun rank itself, False in its children (dataloader workers...)."""
    env = dict(os.environ) if env is None else env
    if env.get("DDPTOP_DISABLE") == "1" or "RANK" not in env:
        return False
    owner = env.get(OWNER_ENV)
    return owner is None or owner == str(os.getpid())


def install() -> bool:
    """Start the reporter in this rank; idempotent, never raises."""
    global _reporter
    with _lock:
        if _reporter is not None:
            return True
        if not is_rank_process():
            return False
        try:
            from ddptop.reporter.agent import Reporter
            from ddptop.reporter.config import config_from_env

            # Children inherit this and so know they are not the rank (spawned workers
            # run sitecustomize too).
            os.environ[OWNER_ENV] = str(os.getpid())
            config = config_from_env()
            reporter = Reporter(config)
            reporter.start()
            when_imported("torch", reporter.torch_imported)
            _reporter = reporter
            if config.local_rank == 0 and AGENT_ENV not in os.environ:
                spawn_node_agent(config.job_id)
            return True
        except Exception as exc:  # the job must run even if we cannot
            print(f"ddptop: reporter disabled in this rank: {exc}", file=sys.stderr)
            return False


def current() -> object | None:
    """The running Reporter of this process, if any (for tests and diagnostics)."""
    return _reporter
