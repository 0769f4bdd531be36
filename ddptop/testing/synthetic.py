"""A synthetic job: N fake ranks speaking the real protocol over real sockets, for tests and benches.

``python -m ddptop.testing.synthetic --ranks 1024 --job-id demo`` opens one listener per rank on
127.0.0.1 with a discovery entry each, so ``ddptop snapshot demo`` and ``ddptop attach
demo`` find it like a torchrun job. Each rank is a real ``ReporterServer`` (the rank's own
handshake, auth and output cap); one thread drives them all on one shared ``ServerLoop``.
The values are :class:`~ddptop.testing.synthetic_ranks.FakeRanks`' (pure in seed, rank, tick).

Scenarios: ``healthy``; ``desync`` (one rank has another batches_per_epoch and, after
``desync_after_s``, sits in an all_gather while its peers wait in all_reduce at the same
seq); ``stall`` (every rank pending in the first collective); ``lost`` (one rank's
listener closes after ``lost_after_s``); ``hang`` (after ``desync_after_s`` the odd rank's
seq stays one short, with no pending op, while every other rank waits in all_reduce at the
next seq); ``silent`` (after ``desync_after_s`` the odd rank's states stop, and its node agent,
if there are agents, reports where it is stuck once it has been silent). With
``ranks_per_agent`` (``--ranks-per-agent``) node agents serve the ranks too, one endpoint
per K ranks (:mod:`.synthetic_agents`); with ``rank_servers=False`` (``--agents-only``)
only the agents listen, which is how a job of 32,768 ranks fits under a 20,000-file limit
(a viewer then needs ``DDPTOP_VIA=agent``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path
from types import TracebackType

from ddptop import protocol as proto
from ddptop.client.collector import GC_THRESHOLD_0
from ddptop.errors import DdptopError, UsageError
from ddptop.net.server import ReporterServer, ServerLoop
from ddptop.protocol import Message, Request
from ddptop.store import discovery
from ddptop.store.discovery import Endpoint
from ddptop.testing.synthetic_agents import FakeAgents
from ddptop.testing.synthetic_process import (
    SyntheticProcess,
    ensure_fd_limit,
    fds_needed,
    run_in_subprocess,
)
from ddptop.testing.synthetic_ranks import SCENARIOS, FakeRanks

log = logging.getLogger(__name__)

__all__ = ["SCENARIOS", "FakeRanks", "SyntheticJob", "SyntheticProcess", "ensure_fd_limit", "fds_needed",
           "main", "run_in_subprocess"]

VIEWER_OUTPUT_CAP = 2 * 1024 * 1024  # thousands of ranks in one process: a rank's 8 MiB each adds up


class SyntheticJob:
    """N fake ranks served by one background thread of this process; a context manager."""

    def __init__(self, n_ranks: int, job_id: str, scenario: str = "healthy", interval_s: float = 1.0,
                 runtime_dir: str | Path | None = None, *, seed: int = 0, fake_gpu: bool = False,
                 steps_per_s: float = 2.0, desync_after_s: float = 3.0, lost_after_s: float = 3.0,
                 token: str | None = None, viewers: int = 1, ranks_per_agent: int = 0,
                 rank_servers: bool = True) -> None:
        if n_ranks < 1 or scenario not in SCENARIOS or interval_s <= 0 or ranks_per_agent < 0:
            raise UsageError(f"need ranks >= 1, interval > 0 and a scenario in {', '.join(SCENARIOS)}")
        if not rank_servers and ranks_per_agent < 1:
            raise UsageError("agents only needs ranks per agent >= 1: somebody must serve the ranks")
        self.n_ranks, self.job_id, self.scenario, self.interval_s = n_ranks, job_id, scenario, interval_s
        self._dir = Path(runtime_dir) if runtime_dir is not None else None
        self._per_agent = ranks_per_agent  # > 0: node agents serve the ranks too (synthetic_agents)
        self.rank_servers = rank_servers  # False: only the agents listen (discovery entries name their ports)
        # A node is the agent's K ranks, or 8 (one host's GPUs) without agents.
        self._make_fake = partial(FakeRanks, n_ranks, job_id, scenario, interval_s, seed=seed,
                                  fake_gpu=fake_gpu, steps_per_s=steps_per_s,
                                  desync_after_s=desync_after_s, per_node=ranks_per_agent or 8)
        self.lost_after_s, self._token, self._viewers = lost_after_s, token, viewers
        self.agents: FakeAgents | None = None
        self.fake: FakeRanks | None = None
        self.endpoints: list[Endpoint] = []
        self._loop: ServerLoop | None = None
        self._servers: dict[int, ReporterServer] = {}  # open listeners: a lost rank's is gone
        self._gone: set[int] = set()  # ranks whose states stopped for good (lost)
        self._ticks: list[int] = []  # per node: its latest tick (every rank of a node shares it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def odd_rank(self) -> int:
        """The rank that desyncs or gets lost (never rank 0 when there are two or more)."""
        assert self.fake is not None, "start() first"
        return self.fake.odd_rank

    @property
    def event_at(self) -> float | None:
        """Wall-clock time of the scenario's event (the hang, the silence, the loss...), if any."""
        assert self.fake is not None, "start() first"
        return self.fake.t0 + self.lost_after_s if self.scenario == "lost" else self.fake.freeze_at \
            if self.scenario == "stall" else self.fake.event_at

    @property
    def runtime_dir(self) -> Path:
        """Where the discovery entries go."""
        return self._dir if self._dir is not None else discovery.runtime_dir()

    def fds_needed(self) -> int:
        """Open files this job needs with its viewers (see :func:`fds_needed`)."""
        return fds_needed(self.n_ranks, self._per_agent, self.rank_servers, self._viewers)

    def start(self) -> SyntheticJob:
        """Open every listener, write the discovery entries and start the serving thread."""
        ensure_fd_limit(self.fds_needed())
        t0 = time.time()
        self.fake = fake = self._make_fake(t0=t0)
        self._ticks = [0] * fake.n_nodes
        self._loop = ServerLoop(wakeable=True)
        directory = self.runtime_dir
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if self._per_agent > 0:
                self.agents = FakeAgents(fake, self._loop, self._token, self._ticks, self._gone)
            for rank in range(self.n_ranks):
                agent_port = self.agents.port_of(rank) if self.agents else 0
                if self.rank_servers:
                    self._servers[rank] = server = ReporterServer(
                        "127.0.0.1", 0, self._token, rank, self.job_id, partial(self._handle, rank),
                        loop=self._loop, max_output=VIEWER_OUTPUT_CAP)
                # Agents only: the discovery entry still exists (discovery finds the rank), at its
                # agent's port.
                endpoint = Endpoint(self.job_id, rank, self.n_ranks, "127.0.0.1",
                                    server.port if self.rank_servers else agent_port, os.getpid(),
                                    start_time=t0, node=fake.host(rank), agent_port=agent_port)
                discovery.write_entry(endpoint, directory)
                self.endpoints.append(endpoint)
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._run, name="ddptop-synthetic", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close every socket and remove the discovery entries (idempotent)."""
        self._stop.set()
        if self._loop is not None:
            self._loop.wake()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        for server in self._servers.values():
            server.close()
        if self.agents is not None:
            self.agents.close()
        if self._loop is not None:
            self._loop.close()
        self._servers, self._loop = {}, None
        for endpoint in self.endpoints:
            (self.runtime_dir / f"{endpoint.job_id}.{endpoint.rank}.json").unlink(missing_ok=True)
        self.endpoints = []

    def __enter__(self) -> SyntheticJob:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _handle(self, rank: int, request: Request) -> Message:
        fake, ident, command = self.fake, request.id, request.command
        assert fake is not None
        tick = fake.heard_tick(rank, self._ticks[fake.node_of(rank)])  # silent: answers what it last said
        if command in ("state", "subscribe"):
            server = self._servers.get(rank)
            return proto.StateMsg(state=fake.state(rank, tick, server.subscribers if server else 0), id=ident)
        if command == "history":
            return proto.HistoryMsg(rank=rank, samples=fake.history(rank, tick), id=ident)
        if command == "stacks":
            return proto.StacksMsg(rank=rank, time=time.time(), threads=fake.stacks(rank, tick), id=ident)
        if command == "fr_trace":
            return proto.FrTraceMsg(rank=rank, time=time.time(), json=fake.fr_json(rank, tick), id=ident)
        return proto.ErrorMsg(reason=f"unsupported request {command!r}", id=ident)

    def _run(self) -> None:
        fake, loop, nodes = self.fake, self._loop, self.fake.n_nodes if self.fake else 1
        assert fake is not None and loop is not None
        lost = False
        slot = 0  # global node-sample index: tick * nodes + node, published in due-time order
        while not self._stop.is_set():
            try:
                now = time.time()
                # Never replay more than one interval of backlog: an overloaded machine skips samples.
                slot = max(slot, int((now - fake.t0) / self.interval_s * nodes) - nodes)
                while fake.node_due(slot % nodes, slot // nodes) <= now and not self._stop.is_set():
                    tick, node = divmod(slot, nodes)
                    slot += 1
                    self._ticks[node] = tick
                    if self._servers:
                        self._publish_ranks(node, tick)
                    if self.agents is not None:
                        self.agents.tick_node(node, tick)
                if self.scenario == "lost" and not lost and now >= fake.t0 + self.lost_after_s:
                    lost = True
                    self._gone.add(fake.odd_rank)
                    if (server := self._servers.pop(fake.odd_rank, None)) is not None:
                        server.close()
                    log.info("synthetic job %s: rank %d lost", self.job_id, fake.odd_rank)
                loop.poll(min(0.2, max(0.0, fake.node_due(slot % nodes, slot // nodes) - time.time())))
            except Exception as exc:  # keep serving: a test must see the failure, not a dead generator
                log.exception("synthetic job %s: %s", self.job_id, exc)
                self._stop.wait(0.05)

    def _publish_ranks(self, node: int, tick: int) -> None:
        # Each rank's own stream: a state is built only for a rank somebody subscribed to.
        assert self.fake is not None
        for rank in self.fake.node_ranks(node):
            server = self._servers.get(rank)
            if server is not None and server.subscribers and self.fake.heard_tick(rank, tick) == tick:
                server.broadcast(proto.StateMsg(state=self.fake.state(rank, tick, server.subscribers)))


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m ddptop.testing.synthetic``: serve a synthetic job until
    --seconds pass or SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m ddptop.testing.synthetic",
                                     description="A synthetic job: N fake ranks speaking the real protocol.")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between a rank's samples")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after S s (0: never)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fake-gpu", action="store_true", help="report a fake NVIDIA GPU per rank (nccl)")
    parser.add_argument("--steps-per-s", type=float, default=2.0)
    parser.add_argument("--desync-after", type=float, default=3.0,
                        help="desync, hang, silent: seconds until the event")
    parser.add_argument("--lost-after", type=float, default=3.0, help="lost: seconds until a rank vanishes")
    parser.add_argument("--ranks-per-agent", type=int, default=0,
                        help="also serve the ranks through one node agent per N ranks (0: no agents)")
    parser.add_argument("--agents-only", action="store_true",
                        help="only the node agents listen (viewers need DDPTOP_VIA=agent); "
                             "--ranks-per-agent defaults to 8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="ddptop-synthetic: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    job = SyntheticJob(args.ranks, args.job_id, args.scenario, args.interval, seed=args.seed,
                       fake_gpu=args.fake_gpu, steps_per_s=args.steps_per_s, desync_after_s=args.desync_after,
                       lost_after_s=args.lost_after, token=os.environ.get("DDPTOP_TOKEN") or None, viewers=0,
                       ranks_per_agent=args.ranks_per_agent or (8 if args.agents_only else 0),
                       rank_servers=not args.agents_only)
    try:
        job.start()
        # This process stands in for thousands of processes (4,096 agents at 32,768 ranks),
        # whose collectors would each walk a few objects: here every full collection walked all
        # of them, 60-210 ms each, four in the first viewer's attach. What start() built lives
        # as long as the job: frozen, so that no collection walks it; young collections every
        # GC_THRESHOLD_0 allocations, as a viewer's (frozen with CPython's 700, every trigger of
        # a full collection passed its long-lived ratio: 25 in 90 s, 220-290 ms each).
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD_0, *gc.get_threshold()[1:])
        ports = [e.port for e in job.endpoints]
        event = f", event at {job.event_at:.3f}" if job.event_at is not None else ""
        odd = f"odd rank {job.odd_rank}{event}"
        print(f"ready: job {args.job_id}, {args.ranks} ranks ({args.scenario}, {odd}) on "
              f"127.0.0.1 ports {min(ports)}-{max(ports)}, discovery entries in {job.runtime_dir}",
              flush=True)
        stop.wait(args.seconds if args.seconds > 0 else None)
    except DdptopError as exc:
        print(f"ddptop-synthetic: error: {exc}", file=sys.stderr)
        return 2
    finally:
        job.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
