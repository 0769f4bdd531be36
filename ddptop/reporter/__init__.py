"""The rank-side reporter. Never imports textual, rich or any viewer module.

:func:`install` is called by ``ddptop launch``'s ``sitecustomize`` in every rank, or by
the user. It starts the agent thread at once and patches torch as soon as torch is
imported (right away if it already is), so nothing the training script constructs
escapes the hooks.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from ddptop.reporter.torch_import import when_imported

log = logging.getLogger(__name__)

_lock = threading.Lock()
_reporter: object | None = None
OWNER_ENV = "DDPTOP_OWNER_PID"


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
            reporter = Reporter(config_from_env())
            reporter.start()
            when_imported("torch", reporter.torch_imported)
            _reporter = reporter
            return True
        except Exception as exc:  # the job must run even if we cannot
            print(f"ddptop: reporter disabled in this rank: {exc}", file=sys.stderr)
            return False


def current() -> object | None:
    """The running Reporter of this process, if any (for tests and diagnostics)."""
    return _reporter
