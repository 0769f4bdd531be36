"""``ddptop launch [options] -- COMMAND...``: run a job with the reporter in every rank.

The reporter is injected through a ``sitecustomize`` on PYTHONPATH: every Python process
of the job loads it, and it starts the reporter only where RANK is set. The training
script is not changed. Signals are forwarded to the command's process group, and the
command's exit code is ours.

This process is also the job's node agent (:mod:`ddptop.agent.node`, run beside the command
by :func:`ddptop.agent.launcher.run_beside`, as ``python -m ddptop.agent`` runs it): it outlives the
ranks, sees how each one ended and keeps the job's black-box record, which ``ddptop
jobs``, ``doctor``, ``replay`` and ``export`` read once the job is gone. Old records are
pruned when a job starts (``DDPTOP_KEEP_DAYS``, ``DDPTOP_KEEP_MB``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from ddptop import auth
from ddptop.agent import outside
from ddptop.agent.launcher import LAUNCH_VOICE, AgentLaunch, run_beside
from ddptop.agent.metrics_http import METRICS_PORT_ENV, parse_listen
from ddptop.agent.node import NodeAgent
from ddptop.agent.recording import DEFAULT_CAP_BYTES
from ddptop.agent.stderr_tail import DEFAULT_CAP_BYTES as DEFAULT_TAIL_BYTES
from ddptop.agent.stderr_tail import StderrTail
from ddptop.errors import UsageError
from ddptop.status import Status
from ddptop.store import discovery, job_token, jobrecord
from ddptop.textfmt import rank_ranges

INJECT_DIR = Path(__file__).resolve().parent.parent / "_inject"
PACKAGE_PARENT = Path(__file__).resolve().parent.parent.parent  # ddptop/cli/launch.py -> the checkout


def configure(parser: argparse.ArgumentParser) -> None:
    """Add launch's options."""
    parser.add_argument("--job-id", help="job id shown by `ddptop jobs` (default: random)")
    parser.add_argument("--bind", help="address ranks serve on (default 127.0.0.1; "
                        "anything else needs DDPTOP_TOKEN)")
    parser.add_argument("--interval", type=float, help="sampling interval in seconds (default 1)")
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="where the job writes its checkpoints: its filesystem filling up is foreseen "
                             "(disk_exhaustion; default $DDPTOP_CHECKPOINT_DIR, else where torch.save wrote)")
    parser.add_argument("--record-mb", type=float, default=None,
                        help=f"size cap of the job's black-box record in MB (default $DDPTOP_RECORD_MB or "
                             f"{DEFAULT_CAP_BYTES >> 20}; 0 turns recording off)")
    parser.add_argument("--metrics-port", metavar="[ADDR:]PORT", default=None,
                        help="serve Prometheus metrics of this node's ranks at http://ADDR:PORT/metrics "
                             "(default $DDPTOP_METRICS_PORT, else off; ADDR defaults to every interface)")
    parser.add_argument("--stacks-signal", action="store_true",
                        help="let outside reads of a silent rank interrupt it (faulthandler's SIGUSR2, "
                             "py-spy --native); by default nothing reaches the rank")
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
    env["DDPTOP_AGENT_PID"] = str(os.getpid())
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
    if not discovery.is_safe_job_id(job_id):
        raise UsageError(f"--job-id {job_id[:40]!r}: use letters, digits, '_', '.', '-' (at most 64)")
    cap = record_cap(args.record_mb)
    metrics_spec = args.metrics_port if args.metrics_port is not None else os.environ.get(METRICS_PORT_ENV)
    listen = parse_listen(metrics_spec) if metrics_spec else None
    if args.stacks_signal:
        os.environ[outside.SIGNAL_ENV] = "1"  # this process is the node agent; its ranks' agents too
    env = job_env(dict(os.environ), job_id, args.bind, args.interval)
    if args.checkpoint_dir:  # absolute: the ranks may change directory
        env["DDPTOP_CHECKPOINT_DIR"] = os.path.abspath(args.checkpoint_dir)
    if os.path.basename(command[0]) == "srun":
        env[LAUNCHER_ENV] = "srun"  # SLURM's tasks are the ranks (see ddptop/_inject/sitecustomize.py)
    agent: NodeAgent | None = None
    try:
        discovery.runtime_dir()  # refuses an unsafe runtime directory (a symlink, another user's)
        _prune_quietly(job_id)
        agent = NodeAgent(job_id, command, cap, record=cap > 0)
    except OSError as exc:
        # The job matters more than watching it: run it, blind, and say why once.
        print(f"ddptop: {exc}; running the job without ddptop", file=sys.stderr)
        env["DDPTOP_DISABLE"] = "1"
    if agent is None:
        return _run_command(command, env, None)
    if cap > 0:
        _fr_dumps_into_record(env, job_id)
    _job_token_quietly(job_id)
    print(f"ddptop: job {job_id}; watch it with `ddptop attach {job_id}`", file=sys.stderr)

    def tell_ranks(port: int) -> None:
        env[discovery.AGENT_PORT_ENV] = str(port)  # they publish it beside their own

    launch = AgentLaunch(voice=LAUNCH_VOICE, serve_on=args.bind or env.get("DDPTOP_BIND") or "127.0.0.1",
                         on_serving=tell_ranks, metrics_on=listen)
    code, record = run_beside(agent, launch, lambda: _run_command(command, env, _stderr_tail(job_id, cap)))
    failed = [o for o in record.ranks if o.status not in (Status.EXITED, Status.RUNNING)]
    if code != 0 or failed:
        culprit = agent.model.first_failure()
        first = f"rank {culprit.rank} {culprit.status} first; " if culprit is not None else ""
        torn = [o.rank for o in failed if o.status == Status.TORN_DOWN]
        down = f"{rank_ranges(torn)} torn down; " if torn else ""
        print(f"ddptop: job {job_id} ended ({code}): {first}{down}see `ddptop doctor {job_id}`",
              file=sys.stderr)
    return code


def _run_command(command: list[str], env: dict[str, str], tail: StderrTail | None) -> int:
    """Run the job's command to its end, signals forwarded to it, its stderr through *tail*
    when there is one; its exit code."""
    try:
        proc = subprocess.Popen(command, env=env, stderr=tail.child_fd if tail is not None else None)
    except OSError as exc:
        raise UsageError(f"cannot start {command[0]}: {exc.strerror}") from None
    if tail is not None:
        tail.child_started()
        tail.start()

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    if tail is not None:
        tail.join(STDERR_DRAIN_S)  # the job's last words on stderr, into the record first
    return code


STDERR_DRAIN_S = 5.0
LAUNCHER_ENV = "DDPTOP_LAUNCHER"


def _stderr_tail(job_id: str, cap: int) -> StderrTail | None:
    """The job's stderr through us, its tail into the record; None (stderr as it was) when
    nothing is recorded (*cap* 0) or on trouble."""
    if cap <= 0:
        return None
    try:
        keep = min(DEFAULT_TAIL_BYTES, max(cap // 4, 1 << 16))
        return StderrTail(jobrecord.job_dir(job_id, create=True), keep)
    except (OSError, ValueError) as exc:
        print(f"ddptop: the job's stderr is not kept: {exc}", file=sys.stderr)
        return None


def _job_token_quietly(job_id: str) -> None:
    # Before the ranks start, so that they all find one (they would make it themselves).
    if auth.load_token() is None:
        try:
            job_token.ensure(job_id)
        except OSError as exc:
            print(f"ddptop: no job token ({exc}); ranks serve loopback without one", file=sys.stderr)


FR_DUMP_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # today's name, then the old
FR_DUMP_PREFIX = "fr_trace_rank_"


def _fr_dumps_into_record(env: dict[str, str], job_id: str) -> None:
    """Point NCCL's Flight Recorder dump on a watchdog timeout into the job's record, so
    ``ddptop doctor JOB`` reads it with everything else; a user's own choice is kept."""
    if any(env.get(name) for name in FR_DUMP_ENVS):
        return
    try:
        prefix = str(jobrecord.job_dir(job_id, create=True) / FR_DUMP_PREFIX)
    except (OSError, ValueError):
        return  # no record directory: the dumps go where torch puts them by default
    for name in FR_DUMP_ENVS:
        env[name] = prefix


def record_cap(option_mb: float | None) -> int:
    """The black box's size cap in bytes (the option, else $DDPTOP_RECORD_MB, else the default)."""
    raw: float | str | None = option_mb if option_mb is not None else os.environ.get("DDPTOP_RECORD_MB")
    if raw is None or raw == "":
        return DEFAULT_CAP_BYTES
    try:
        mb = float(raw)
    except ValueError:
        raise UsageError(f"DDPTOP_RECORD_MB={raw!r} is not a number of megabytes") from None
    if mb < 0:
        raise UsageError(f"the record size cap must be >= 0 MB, not {mb:g}")
    return int(mb * 1024 * 1024)


def _prune_quietly(current: str) -> None:
    # Retention is housekeeping: it must never stop a job from starting.
    try:
        max_age, max_bytes = jobrecord.retention_from_env()
        jobrecord.prune(max_age, max_bytes, keep=frozenset((current,)))
    except OSError as exc:
        print(f"ddptop: old job records not pruned: {exc}", file=sys.stderr)
