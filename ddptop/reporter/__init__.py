"""The rank-side reporter. Never imports textual, rich or any viewer module.

:func:`install` is called by ``ddptop launch``'s ``sitecustomize`` in every rank, or by
the user. It starts the reporter thread at once and patches torch as soon as torch is
imported (right away if it already is), so nothing the training script constructs
escapes the hooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import ModuleType
from typing import Any

from ddptop.reporter.identity import RANK_VARIABLES, RankIdentity, from_env, from_process_group
from ddptop.reporter.torch_import import when_imported

_lock = threading.Lock()
_reporter: object | None = None
_deferred = False
OWNER_ENV = "DDPTOP_OWNER_PID"
AGENT_ENV = "DDPTOP_AGENT_PID"  # set by `ddptop launch`, which is the node agent itself
RANK_VARS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE")


def spawn_node_agent(job_id: str) -> None:
    """Start the node agent that keeps this job's black box (no launcher here to do it).

    ``python -m ddptop.agent`` in a session of its own: it outlives the ranks, sees their
    exits and ends by itself when they are gone. Failure only costs the recording.
    """
    if os.environ.get("DDPTOP_RECORD_MB", "").strip() in ("0", "0.0"):
        return
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env[AGENT_ENV] = "spawned"
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    try:
        # It serves where the ranks do (DDPTOP_BIND): viewers and the other nodes' agents
        # reach this node through it, as under `ddptop launch` (the ranks learn its port).
        serve = os.environ.get("DDPTOP_BIND", "127.0.0.1")
        subprocess.Popen([sys.executable, "-m", "ddptop.agent", "--job-id", job_id,
                          "--rank-pid", str(os.getpid()), "--serve", serve], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError as exc:
        print(f"ddptop: no black box for this job: {exc}", file=sys.stderr)


def is_rank_process(env: dict[str, str] | None = None) -> bool:
    """True in a rank itself (a launcher named its rank), False in its children (DataLoader
    workers inherit the variables, and the owner's pid says they are not the rank)."""
    env = dict(os.environ) if env is None else env
    if env.get("DDPTOP_DISABLE") == "1" or not any(name in env for name in RANK_VARIABLES):
        return False
    return _owner_is_us(env)


def _owner_is_us(env: dict[str, str]) -> bool:
    owner = env.get(OWNER_ENV)
    return owner is None or owner == str(os.getpid())


def install() -> bool:
    """Start the reporter in this rank; idempotent, never raises.

    The rank is the launcher's (torchrun, srun, mpirun: :mod:`ddptop.reporter.identity`) or,
    in a process no launcher named (``torch.multiprocessing.spawn``, a script's own
    launcher), the default process group's once ``init_process_group`` ran: until then the
    reporter waits for it (False, said once on stderr).
    """
    global _deferred
    with _lock:
        if _reporter is not None:
            return True
        if os.environ.get("DDPTOP_DISABLE") == "1" or not _owner_is_us(dict(os.environ)):
            return False
        env = dict(os.environ)
        identity = from_env(env)
        if identity is None and "torch.distributed" in sys.modules:  # initialised already?
            identity = from_process_group(sys.modules["torch.distributed"], env)
        if identity is not None:
            return _start(identity)
        if not _deferred:
            _deferred = True
            print("ddptop: no rank yet (no RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK): the "
                  "reporter starts when torch.distributed.init_process_group runs", file=sys.stderr)
            when_imported("torch", _start_at_init)
        return False


def _start(identity: RankIdentity) -> bool:
    """Start the reporter for *identity* (the caller holds the lock)."""
    global _reporter
    try:
        from ddptop.reporter.config import config_from_env
        from ddptop.reporter.sampler import Reporter

        # Children inherit this and so know they are not the rank (spawned workers
        # run sitecustomize too).
        os.environ[OWNER_ENV] = str(os.getpid())
        config = config_from_env(identity=identity)
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


def _start_at_init(torch: ModuleType) -> None:
    """Wrap ``init_process_group``: once it returns, this process knows its rank."""
    from torch.distributed import distributed_c10d as c10d

    original = c10d.init_process_group
    if getattr(original, "_ddptop_patched", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        try:
            with _lock:
                identity = from_process_group(torch.distributed, dict(os.environ))
                if _reporter is None and identity is not None and _owner_is_us(dict(os.environ)):
                    _start(identity)
        except Exception as exc:  # never fail the job's init
            print(f"ddptop: reporter not started: {exc}", file=sys.stderr)
        return out

    init_process_group._ddptop_patched = True  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group
    if getattr(torch.distributed, "init_process_group", None) is original:
        torch.distributed.init_process_group = init_process_group


def current() -> object | None:
    """The running Reporter of this process, if any (for tests and diagnostics)."""
    return _reporter
