"""``python -m ddptop.agent --job-id JOB``: the node agent without ``ddptop launch``.

A job started with ``ddptop.install()`` in the script has no launcher to outlive its
ranks, so local rank 0's reporter spawns this process (in a session of its own) to keep
the job's black box on this host. One agent per job and host: a lock file in the job's
record directory keeps a second one from starting. It ends by itself once every rank it
saw is gone (or none appeared within ``--first-rank-s``, or ``--seconds`` passed), and
prints a JSON summary on stdout (the recording benchmark reads it).

SIGTERM ends it the same way, its record closed: under ``srun`` it is a process of the job
step, and the step's end (``--kill-on-bad-exit``, ``scancel``) signals it with the tasks, a
moment after the task that failed; it then still records how the ranks ended (their exit
statuses: the failed task's too, read from its pidfd) before it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from ddptop.agent.launcher import SPAWNED_VOICE, AgentLaunch, run_beside
from ddptop.agent.metrics_http import METRICS_PORT_ENV, parse_listen
from ddptop.agent.node import NodeAgent
from ddptop.agent.outside import SIGNAL_ENV
from ddptop.agent.recording import DEFAULT_CAP_BYTES
from ddptop.errors import DdptopError, exit_code_for
from ddptop.store import discovery, jobrecord

LOCK_FILE = "agent.lock"


def _lock(job_id: str) -> bool:
    """Take the job's agent lock on this host; False if a live agent holds it."""
    path = jobrecord.job_dir(job_id, create=True) / LOCK_FILE
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            try:
                held = discovery.private_read(path, 64)  # a pid: capped, never through a link
                holder = int((held or b"").strip() or b"0")
            except ValueError:
                holder = 0
            if holder and discovery.pid_alive(holder):
                return False
            path.unlink(missing_ok=True)  # a dead agent's lock
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    """Record the job until its ranks are gone; print a JSON summary."""
    parser = argparse.ArgumentParser(prog="python -m ddptop.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--record-mb", type=float, default=DEFAULT_CAP_BYTES / 1024 / 1024)
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: when ranks end)")
    parser.add_argument("--first-rank-s", type=float, default=60.0, help="give up if no rank appears by then")
    parser.add_argument("--rank-pid", type=int, default=0,
                        help="the rank that spawned this agent: once it is gone and no rank runs, stop")
    parser.add_argument("--metrics-port", metavar="[ADDR:]PORT", default=os.environ.get(METRICS_PORT_ENV),
                        help="serve Prometheus metrics there (default $DDPTOP_METRICS_PORT, else off)")
    parser.add_argument("--serve", metavar="ADDR", default="",
                        help="serve this node's ranks to viewers (and the other nodes' agents) on ADDR; "
                             "its port goes to <job>.agent in the runtime directory, where the ranks "
                             "read it and name it in their discovery entries and the job's store")
    parser.add_argument("--stacks-signal", action="store_true",
                        help="let outside reads of a silent rank interrupt it (SIGUSR2, py-spy --native)")
    args = parser.parse_args(argv)
    if args.stacks_signal:
        os.environ[SIGNAL_ENV] = "1"
    try:
        if not discovery.is_safe_job_id(args.job_id):
            raise DdptopError(f"not a job id: {args.job_id[:40]!r}")
        listen = parse_listen(args.metrics_port) if args.metrics_port else None
        if not _lock(args.job_id):
            return 0  # another agent already keeps this job's recording here
        agent = NodeAgent(args.job_id, [], int(args.record_mb * 1024 * 1024), record=args.record_mb > 0)
    except (DdptopError, OSError) as exc:
        print(f"ddptop agent: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    began = time.monotonic()

    def tell_ranks(port: int) -> None:
        discovery.write_agent_port(args.job_id, port)  # the ranks name it from now on

    launch = AgentLaunch(voice=SPAWNED_VOICE, serve_on=args.serve, on_serving=tell_ranks, metrics_on=listen,
                         grace_s=2.0)
    stop: list[int] = []  # a list, not an Event: a handler must take no lock the main thread may hold

    def on_term(signum: int, frame: Any) -> None:
        stop.append(signum)  # the loop below sees it within its tick; finishing happens there, not here

    signal.signal(signal.SIGTERM, on_term)
    _none, record = run_beside(agent, launch, lambda: _until_ranks_gone(agent, args, began, stop))
    (jobrecord.job_dir(args.job_id) / LOCK_FILE).unlink(missing_ok=True)
    (discovery.runtime_dir(create=False) / f"{args.job_id}.{discovery.AGENT_SUFFIX}").unlink(missing_ok=True)
    summary = {"job_id": args.job_id, "ranks": len(record.ranks),
               "seconds": round(time.monotonic() - began, 3), "record_bytes": record.record_bytes,
               "frames": agent.recording.frames if agent.recording else 0,
               "compactions": agent.recording.compactions if agent.recording else 0}
    print(json.dumps(summary), flush=True)
    return 0


def _until_ranks_gone(agent: NodeAgent, args: argparse.Namespace, began: float, stop: list[int]) -> None:
    """Wait until every rank seen is gone (or none came in time, or the time is up, or ^C, or
    SIGTERM: *stop* holds it)."""
    try:
        while not stop:
            time.sleep(0.2)
            elapsed = time.monotonic() - began
            if args.seconds and elapsed >= args.seconds:
                return
            seen = agent.ranks_seen
            if not seen and (elapsed >= args.first_rank_s
                             or (args.rank_pid and not discovery.pid_alive(args.rank_pid))):
                return
            if seen and agent.ranks_running == 0:
                return
    except KeyboardInterrupt:
        return


if __name__ == "__main__":
    sys.exit(main())
