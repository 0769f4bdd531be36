"""``ddptop launch [options] -- COMMAND...``: run a job with the reporter in every rank.

The reporter is injected through a ``sitecustomize`` on PYTHONPATH: every Python process
of the job loads it, and it starts the reporter only where RANK is set. The training
script is not changed. Signals are forwarded to the command's process group, and the
command's exit code is ours.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import ddptop
from ddptop import auth
from ddptop.errors import UsageError

INJECT_DIR = Path(__file__).resolve().parent.parent / "_inject"
PACKAGE_PARENT = Path(ddptop.__file__).resolve().parent.parent


def configure(parser: argparse.ArgumentParser) -> None:
    """Add launch's options."""
    parser.add_argument("--job-id", help="job id shown by `ddptop jobs` (default: random)")
    parser.add_argument("--bind", help="address ranks serve on (default 127.0.0.1; "
                        "anything else needs DDPTOP_TOKEN)")
    parser.add_argument("--interval", type=float, help="sampling interval in seconds (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command, after `--` (e.g. torchrun --nproc-per-node 4 train.py)")


def job_env(base: dict[str, str], job_id: str, bind: str | None = None,
            interval: float | None = None) -> dict[str, str]:
    """The environment that makes every rank of the command start a reporter."""
    env = dict(base)
    paths = [str(INJECT_DIR), str(PACKAGE_PARENT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["DDPTOP_JOB_ID"] = job_id
    env.pop("DDPTOP_OWNER_PID", None)
    if bind:
        env["DDPTOP_BIND"] = bind
    if interval:
        env["DDPTOP_INTERVAL"] = str(interval)
    return env


def new_job_id() -> str:
    """A short random job id."""
    return uuid.uuid4().hex[:8]


def run(args: argparse.Namespace) -> int:
    """Run the command; return its exit code."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to launch: give a command after `--`")
    if args.bind and args.bind not in auth.LOOPBACK_BINDS and not (
        os.environ.get("DDPTOP_TOKEN") or os.environ.get("DDPTOP_TOKEN_FILE")
    ):
        raise UsageError(f"--bind {args.bind} exposes the job beyond this host: set DDPTOP_TOKEN first")
    job_id = args.job_id or new_job_id()
    env = job_env(dict(os.environ), job_id, args.bind, args.interval)
    print(f"ddptop: job {job_id}; watch it with `ddptop attach {job_id}`", file=sys.stderr)
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise UsageError(f"cannot start {command[0]}: {exc.strerror}") from None

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    return proc.wait()
