"""The node agents' exchange at 512 nodes x 8 ranks: one agent's bytes/s and CPU, steady and
during a mass exit.

    python bench/exchange_scale.py [--nodes 512] [--ranks-per-node 8] [--steady-s 20]

Every agent of a job subscribes to every other agent's news and serves its own to all of
them (:mod:`ddptop.agent.exchange`), so one agent's cost is what this measures: the subject
process runs one real agent's exchange side (an :class:`Exchange` subscribed to the others,
and a :class:`NodeEndpoint` serving its own news and beats to them). A second process plays
the other 511 agents on real loopback sockets, with the real protocol: 511 agent endpoints
(each beating every 2 s with its 8 ranks' steps) and 511 subscribers to the subject's news.

Phases, measured in the subject process only (user+system CPU from getrusage, bytes as
received from and sent to the sockets):

* ``steady``: beats only, for --steady-s seconds;
* ``mass exit``: every rank of the job ends within a second (each agent tells each of its
  ranks' last state, trimmed, and exit): from the trigger until the subject knows every
  other rank's ending, and the subject tells its own 8 to the 511 others.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.agent import exchange as exchange_mod
from ddptop.agent.endpoint import NodeEndpoint
from ddptop.agent.exchange import Exchange
from ddptop.agent.serving import news_state
from ddptop.client.live import LiveSource
from ddptop.client.targets import JobTarget
from ddptop.net.server import ReporterServer, ServerLoop
from ddptop.protocol import AgentBeat, AgentReply, Message, RankExit, RecordEntry, Request, StateMsg
from ddptop.store.discovery import Endpoint
from ddptop.testing.synthetic import FakeRanks
from tests.stand_in_agent import StandInAgent

JOB = "xbench"
TOKEN = "exchange-bench-token"


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---------------------------------------------------------------- the other agents (child)

def run_others(subject_port: int, nodes: int, per_node: int) -> None:
    """511 agent endpoints and 511 subscribers to the subject; commands on stdin."""
    _raise_fd_limit()
    fake = FakeRanks(nodes * per_node, JOB, "healthy", 1.0, time.time())
    loop = ServerLoop(wakeable=True)

    def handle(request: Request) -> Message:
        return AgentReply(time=time.time(), entries=[], id=request.id)

    servers = [ReporterServer("127.0.0.1", 0, TOKEN, -1, JOB, handle, loop=loop, role="agent",
                              max_output=16 << 20) for _ in range(1, nodes)]
    subscribers = LiveSource(JobTarget(job_id=JOB, world_size=0, endpoints=[], via_agents=True), token=TOKEN,
                             read_remains=False, read_stuck=False, news=True)
    got = [0]
    subscribers.start(lambda event: got.__setitem__(0, got[0] + 1))
    subject = Endpoint(job_id=JOB, rank=-1, world_size=nodes * per_node, host="127.0.0.1", port=subject_port,
                       pid=0)
    for node in range(1, nodes):
        subscribers.add_agent(subject, list(range(node * per_node, (node + 1) * per_node)))
    print(" ".join(str(s.port) for s in servers), flush=True)
    lock = threading.Lock()
    pending: list[tuple[ReporterServer, Message]] = []
    stop = threading.Event()

    def serve() -> None:
        next_beat = 0.0
        tick = 0
        while not stop.is_set():
            loop.poll(0.05)
            with lock:
                out, pending[:] = list(pending), []
            for server, message in out:
                server.broadcast(message, news=True)
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + exchange_mod.BEAT_S
                tick += 1
                for node, server in enumerate(servers, start=1):
                    ranks = list(range(node * per_node, (node + 1) * per_node))
                    server.broadcast(AgentBeat(time=time.time(), host=f"node-{node}", ranks=ranks,
                                               steps=[tick * 2] * per_node), news=True)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    for line in sys.stdin:
        if line.strip() == "exit":
            now = time.time()
            with lock:
                for node, server in enumerate(servers, start=1):
                    for rank in range(node * per_node, (node + 1) * per_node):
                        state = news_state(fake.state(rank, 100, clients=1))
                        last = RecordEntry(time=now, rank=rank, message=StateMsg(state=state))
                        pending.append((server, last))
                        pending.append((server, RankExit(time=now, rank=rank, pid=1000 + rank,
                                                         host=f"node-{node}", signal="SIGTERM")))
            loop.wake()
        elif line.strip() == "count":
            print(got[0], flush=True)
        elif line.strip() == "quit":
            break
    stop.set()
    thread.join(timeout=2)
    subscribers.stop()
    for server in servers:
        server.close()


# ---------------------------------------------------------------- the subject (parent)

def _usage(ex: Exchange, endpoint: NodeEndpoint) -> tuple[float, int, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ex.bytes_in, endpoint.server.counters.bytes_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--steady-s", type=float, default=20.0)
    parser.add_argument("--others", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.others:
        run_others(args.others, args.nodes, args.ranks_per_node)
        return
    _raise_fd_limit()
    per = args.ranks_per_node
    told: list[object] = []
    endpoint = NodeEndpoint("127.0.0.1", 0, TOKEN, JOB, StandInAgent())
    ex = Exchange(JOB, TOKEN, told.append, ("127.0.0.1", endpoint.port))
    ex.start(None)
    child = subprocess.Popen([sys.executable, __file__, "--others", str(endpoint.port),
                              "--nodes", str(args.nodes), "--ranks-per-node", str(per)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        ports = [int(p) for p in child.stdout.readline().split()]
        endpoints = [Endpoint(job_id=JOB, rank=r, world_size=args.nodes * per, host="127.0.0.1", port=1,
                              pid=1, node=f"node-{n}", agent_port=port)
                     for n, port in enumerate(ports, start=1) for r in range(n * per, (n + 1) * per)]
        began = time.monotonic()
        ex.add_endpoints(endpoints, args.nodes * per)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(1 for p in ex.peers.values() if p.heard_at) < len(ports):
            time.sleep(0.1)
        while time.monotonic() < deadline and endpoint.server.client_count < len(ports):
            time.sleep(0.1)
        connected = sum(1 for p in ex.peers.values() if p.heard_at)
        setup_s = time.monotonic() - began
        print(f"<!-- {args.nodes} nodes x {per} ranks: {connected}/{len(ports)} agents heard, "
              f"{endpoint.server.client_count}/{len(ports)} subscribed to ours, in {setup_s:.1f} s -->")
        print("| phase | seconds | CPU % of one core | bytes/s in | bytes/s out | bytes/s in per peer |")
        print("|---|---|---|---|---|---|")
        cpu0, rin0, wout0 = _usage(ex, endpoint)
        t0 = time.monotonic()
        next_beat = 0.0
        while time.monotonic() - t0 < args.steady_s:
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + exchange_mod.BEAT_S
                endpoint.publish(AgentBeat(time=time.time(), host="node-0", ranks=list(range(per)),
                                           steps=[1] * per), news=True)
            time.sleep(0.05)
        _row("steady (beats)", _usage(ex, endpoint), t0, cpu0, rin0, wout0, len(ports))
        cpu0, rin0, wout0 = _usage(ex, endpoint)
        t0 = time.monotonic()
        child.stdin.write("exit\n")
        child.stdin.flush()
        fake = FakeRanks(per, JOB, "healthy", 1.0, time.time())
        for rank in range(per):
            last = StateMsg(state=news_state(fake.state(rank, 100, clients=1)))
            endpoint.publish(RecordEntry(time=time.time(), rank=rank, message=last), news=True)
            gone = RankExit(time=time.time(), rank=rank, pid=1, host="node-0", signal="SIGTERM")
            endpoint.publish(gone, news=True)
        want = len(ports) * per
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(1 for e in told if isinstance(e, RankExit)) < want:
            time.sleep(0.02)
        exits = sum(1 for e in told if isinstance(e, RankExit))
        _row(f"mass exit ({exits}/{want} endings known)", _usage(ex, endpoint), t0, cpu0, rin0, wout0,
             len(ports))
        child.stdin.write("quit\n")
        child.stdin.flush()
    finally:
        ex.close()
        endpoint.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=10)


def _row(name: str, now: tuple[float, int, int], t0: float, cpu0: float, rin0: int, wout0: int,
         peers: int) -> None:
    cpu, rin, wout = now
    took = time.monotonic() - t0
    print(f"| {name} | {took:.2f} | {100 * (cpu - cpu0) / took:.1f} | {(rin - rin0) / took:,.0f} | "
          f"{(wout - wout0) / took:,.0f} | {(rin - rin0) / took / peers:,.0f} |", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
