"""The whole job's ending, told by any node that survived: 6 ranks on 3 hosts, for real.

Three network namespaces on one switch (each with its own hostname and runtime directory)
run ``ddptop launch --bind 0.0.0.0`` over ``torchrun --nnodes 3``, 2 ranks each, with one
``DDPTOP_TOKEN``; the job's TCPStore is on host a. The node agents find each other in it
and exchange news (:mod:`ddptop.agent.exchange`). Then host b fails:

* its two ranks are SIGKILLed (its agent lives on and tells the others how they died);
* or its whole tree (agent, torchrun and ranks) is SIGKILLed and its link goes down;
* or, with everything alive, host c's link goes down (a cut cable): a doctor started on each
  host names host c unreachable since the cut (host c's own: every other host, its own
  link the likely cut) while the others still wait in their collective; a doctor started
  on host a with only ``MASTER_ADDR:PORT`` names host c by name and address within 15 s of
  the cut, since when as host a's agent recorded it.

After the job ended everywhere, ``ddptop doctor JOB`` on host a and on host c (each from its
own record only) names host b's ranks as the first failure, with host b, and never one of
its own ranks (those failed because a peer was gone); the lost host is a ``node_lost``.
Skipped, with the reason, where network namespaces cannot be created.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ddptop.agent.exchange import BEAT_S
from ddptop.proctree import descendants, stop_tree
from tests.jobs import BIN, PROBES, ddptop_cmd, wait_until
from tests.netns import Host, host_env, hosts, unavailable
from tests.ports import namespace_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

WHY_NOT = unavailable()
TOKEN = "three-hosts-test-token"
# How long a rank waits for a vanished peer in a collective, then fails: a cut cable's doctors
# (each imports torch to read the job's store) are done well before (the tests that end a host
# close its sockets, and its peers fail at once).
PROBE_PG_TIMEOUT_S = 60
STORE_DOCTOR_S = 15.0  # a doctor of MASTER_ADDR:PORT started after a cut has named the host by then


@dataclass
class ThreeHostJob:
    """The running job: its hosts, their launch processes, runtime dirs and environments."""

    job_id: str
    hosts: list[Host]
    procs: list[subprocess.Popen[bytes]]
    runtime: list[Path]
    envs: list[dict[str, str]]
    store: str = ""  # MASTER_ADDR:MASTER_PORT, the job's TCPStore (on host a)

    def record(self, i: int) -> dict[str, Any]:
        path = self.runtime[i] / "jobs" / self.job_id / "job.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}

    def rank_pid(self, i: int, rank: int) -> int:
        data = json.loads((self.runtime[i] / f"{self.job_id}.{rank}.json").read_text())
        return int(data["pid"])

    def steps(self, i: int) -> int:
        """The lowest step of host *i*'s ranks (0 until both report). The snapshot holds the
        other hosts' ranks too (read from the job's store): only this host's count here."""
        res = self.hosts[i].run(ddptop_cmd("snapshot", "--json", self.job_id), self.envs[i], timeout=60)
        try:
            ranks = [r for r in json.loads(res.stdout)["ranks"] if r["host"] == self.hosts[i].hostname]
        except (ValueError, KeyError):
            return 0
        return min((r["step"] for r in ranks), default=0) if len(ranks) == 2 else 0

    def doctor(self, i: int, target: str = "", watch: float = 0.0) -> tuple[int, dict[str, Any], str]:
        """``ddptop doctor --json`` on host *i*, of the job by its id (or by *target*), watching
        it up to *watch* seconds (else doctor's default)."""
        watching = ["--watch", f"{watch:.1f}"] if watch else []
        res = self.hosts[i].run(ddptop_cmd("doctor", "--json", *watching, target or self.job_id),
                                self.envs[i], timeout=120)
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            doc = {}
        return res.returncode, doc, res.stderr


@pytest.fixture
def three_hosts(tmp_path: Path) -> Iterator[ThreeHostJob]:
    """A 6-rank job on 3 hosts whose agents exchanged news; always stopped and deleted."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    port = namespace_port()
    job_id = f"t3h{os.getpid()}"
    # A rank waits PROBE_PG_TIMEOUT in a collective whose peer vanished without a word (a node
    # that loses its link closes no connection), as NCCL's watchdog would, then fails.
    base = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PROBE_SECONDS="150",
                PROBE_PG_TIMEOUT=str(PROBE_PG_TIMEOUT_S),
                PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", DDPTOP_TOKEN=TOKEN)
    with hosts(3) as made:
        job = ThreeHostJob(job_id, made, [], [], [], store=f"{made[0].address}:{port}")
        try:
            for node_rank, host in enumerate(made):
                rt = tmp_path / f"rt-{node_rank}"
                rt.mkdir(mode=0o700)
                env = host_env(base, host, rt)
                job.runtime.append(rt)
                job.envs.append(env)
                torchrun = [str(BIN / "torchrun"), "--nnodes", "3", "--node-rank", str(node_rank),
                            "--nproc-per-node", "2", "--master-addr", made[0].address,
                            "--master-port", str(port)]
                cmd = ddptop_cmd("launch", "--bind", "0.0.0.0", "--job-id", job_id, "--interval", "0.5",
                                 "--", *torchrun, str(PROBES / "healthy.py"))
                job.procs.append(host.popen(cmd, tmp_path / f"host-{node_rank}.log", env))
            for i in range(3):
                wait_until(lambda i=i: "exchanged news with 2 of 2" in job.record(i).get("exchange", ""),
                           240.0, f"host {i}'s agent to exchange news with the two others")
            wait_until(lambda: job.steps(1) >= 3, 120.0, "host b's ranks to train")
            yield job
        finally:
            for proc in job.procs:
                stop_tree(proc)
            for i in range(3):
                log = tmp_path / f"host-{i}.log"
                if log.exists():
                    print(f"--- host {i}:\n{log.read_text(errors='replace')[-3000:]}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _ended(job: ThreeHostJob, which: list[int]) -> None:
    wait_until(lambda: all(job.procs[i].poll() is not None for i in which), 150.0,
               "the surviving hosts' launches to end")


def _first_failure(doc: dict[str, Any]) -> dict[str, Any]:
    lost = [f for f in doc.get("findings", []) if f["kind"] == "rank_lost" and f["severity"] == "critical"]
    assert lost, json.dumps(doc)[:3000]
    return dict(lost[0])


@pytest.mark.long  # the exchange's endings; the cut cable below keeps three hosts in make test
def test_one_hosts_ranks_killed_every_survivor_names_them_and_their_host(three_hosts: ThreeHostJob) -> None:
    job = three_hosts
    a, b, c = job.hosts
    killed_at = time.time()
    for rank in (2, 3):
        os.kill(job.rank_pid(1, rank), signal.SIGKILL)
    _ended(job, [0, 1, 2])
    for i, host in ((0, a), (2, c)):
        rc, doc, err = job.doctor(i)
        assert rc == 1 and "Traceback" not in err, err
        first = _first_failure(doc)
        print(f"doctor on {host.hostname}: {first['title']}")
        assert first["ranks"][0] in (2, 3), first
        assert b.hostname in first["title"] and "SIGKILL" in first["title"], first
        assert first["step"] >= 3, first  # the step it died at, as host b's agent told
        assert first["since"] >= killed_at - 1.0
        # Its own ranks failed because the peers were gone: torn down, never the cause.
        own = {2 * i, 2 * i + 1}
        assert not own & set(first["ranks"][:2]), first
        assert any("torn down" in line for line in first["evidence"]), first["evidence"]
        # A victim's "Connection closed by peer [addr]:port" is joined to the host the job's
        # store put at that address (#20 item 2).
        mapped = [line for line in first["evidence"] if "lost its connection to" in line]
        assert any(f"that is {b.hostname} ({b.address}), where ranks 2-3 ran" in line for line in mapped), \
            first["evidence"]
        assert not [f for f in doc["findings"] if f["kind"] == "node_lost"], doc["findings"]
        assert "exchanged news with 2 of 2" in job.record(i)["exchange"]


@pytest.mark.long
def test_a_whole_host_lost_every_survivor_names_it_node_lost(three_hosts: ThreeHostJob) -> None:
    job = three_hosts
    a, b, c = job.hosts
    # The others know host b's steps from its agent's beats: let one beat carry a step past 3.
    trained = job.steps(1)
    since = time.monotonic()
    wait_until(lambda: time.monotonic() - since > 2 * BEAT_S and job.steps(1) > trained, 60.0,
               "a beat of host b's agent after its ranks trained")
    # The agent first: killed after torchrun or a rank, it could see that death and tell the
    # others of it in the moment between two kills (seen once in CI: node_lost named only rank
    # 3, rank 2's ending told by its agent). Then torchrun and the ranks: nothing on host b says
    # goodbye.
    tree = [job.procs[1].pid] + [p.pid for p in descendants(job.procs[1].pid)]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Once they are gone (their sockets closed, so the others' collectives fail at once rather
    # than at gloo's timeout), the host leaves the network: its agent can never be reached again.
    wait_until(lambda: not any(_alive(pid) for pid in tree), 30.0, "host b's processes to die")
    b.link(up=False)
    _ended(job, [0, 2])
    for i, host in ((0, a), (2, c)):
        rc, doc, err = job.doctor(i)
        assert rc == 1 and "Traceback" not in err, err
        lost = [f for f in doc["findings"] if f["kind"] == "node_lost"]
        print(f"doctor on {host.hostname}: {[f['title'] for f in doc['findings']]}")
        assert len(lost) == 1 and lost[0]["ranks"] == [2, 3], doc["findings"]
        seen = [line for line in lost[0]["evidence"] if "last seen at step" in line]
        assert seen and not any(line.endswith(" step 0") for line in seen), lost[0]
        assert b.hostname in lost[0]["title"], lost[0]
        first = _first_failure(doc)
        assert first["ranks"][0] in (2, 3) and b.hostname in first["title"], first
        assert "lost: " + b.hostname in job.record(i)["exchange"], job.record(i)


def _unreachable(job: ThreeHostJob, i: int, ranks: list[int], last: dict[int, str]) -> dict[str, Any] | None:
    """The first finding of a doctor on host *i*, when it is a host_unreachable of *ranks*
    (else None; what it said instead in *last*)."""
    rc, doc, err = job.doctor(i)
    assert "Traceback" not in err, err
    findings = doc.get("findings", [])
    said = [ln for ln in err.splitlines() if ln.startswith("ddptop")]  # not torch's store client's spew
    last[i] = f"rc={rc} {[(f['kind'], f['ranks'], f['title']) for f in findings]} {said[-4:]}"
    first = findings[0] if findings else {}
    return dict(first) if first.get("kind") == "host_unreachable" and first["ranks"] == ranks else None


def test_a_cut_link_names_the_host_from_every_side_and_the_cut_host_its_lost_peers(
        three_hosts: ThreeHostJob) -> None:
    job = three_hosts
    a, b, c = job.hosts
    cut = time.time()
    c.cable(connected=False)  # a cut cable: host c's ranks and agent live on, nothing closes
    told: dict[int, dict[str, Any]] = {}
    after: dict[int, float] = {}
    last: dict[int, str] = {}

    def until_named(i: int) -> None:
        # Doctors started one after another on host i (after the cut): each sees its live view
        # and what its node agent's exchange recorded when the beats stopped. Before the ranks'
        # collective times out (then they fail, and that becomes the story).
        ranks = [0, 1, 2, 3] if i == 2 else [4, 5]  # all of them (a verdict is recorded rank by rank)

        def named() -> bool:
            found = _unreachable(job, i, ranks, last)
            return found is not None and bool(told.setdefault(i, found))

        try:
            wait_until(named, PROBE_PG_TIMEOUT_S - (time.time() - cut),
                       f"host {i}'s doctor to name the unreachable host first")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last doctor: {last.get(i)}") from None
        after[i] = time.time() - cut

    # First, alone: a person on host a who knows only MASTER_ADDR:PORT starts a doctor right
    # after the cut and lets it watch until 15 s after it. It is done as soon as host a's agent's
    # verdict is in its record (read again every second; the ranks it holds cut off are not
    # waited for), naming host c by name and address, since when as that agent saw it.
    named = (rf"host {c.hostname} \({re.escape(c.address)}\) unreachable since \d\d:\d\d:\d\d, "
             rf"as {a.hostname}'s agent saw it: ranks 4-5")
    rc, doc, err = job.doctor(0, job.store, watch=STORE_DOCTOR_S - (time.time() - cut))
    done_s = time.time() - cut
    assert "Traceback" not in err, err
    first = (doc.get("findings") or [{"title": f"rc={rc} {err.strip()[-300:]}"}])[0]
    print(f"doctor of {job.store} on {a.hostname}, done {done_s:.1f} s after the cut: {first['title']}")
    assert re.fullmatch(named, first["title"]) and done_s <= STORE_DOCTOR_S, (done_s, first)
    assert cut - 3 * BEAT_S <= first["since"] <= cut + 1.0, (cut, first)
    assert any(c.address in line for line in first["evidence"]), first["evidence"]
    # It read no store (torch's client: seconds to import): host a's agent kept the store's copy.
    assert (job.runtime[0] / "jobs" / job.job_id / "store.json").is_file()

    with ThreadPoolExecutor(3) as pool:
        for done in [pool.submit(until_named, i) for i in (0, 1, 2)]:
            done.result()
    for i in (0, 1, 2):
        print(f"doctor on {job.hosts[i].hostname}, {after[i]:.1f} s after the cut: {told[i]['title']}")
    for i in (0, 1):  # the sides that still talk to each other: host c, since about the cut
        first = told[i]
        assert first["ranks"] == [4, 5] and first["severity"] == "critical", first
        title = first["title"]
        said = (rf"host {c.hostname} \({re.escape(c.address)}\) unreachable since \d\d:\d\d:\d\d, "
                rf"as {job.hosts[i].hostname}'s agent saw it: ranks 4-5")
        assert re.fullmatch(said, title), first
        assert cut - 3 * BEAT_S <= first["since"] <= cut + 1.0, (cut, first)
        assert any(c.address in line for line in first["evidence"]), first["evidence"]
    # Host c's own view: it lost every other host at once, so its own link is the likely cut.
    own = told[2]
    assert own["ranks"] == [0, 1, 2, 3], own
    assert own["title"].startswith(f"every other host unreachable from {c.hostname} since "), own
    assert f"{a.hostname} (ranks 0-1), {b.hostname} (ranks 2-3)" in own["title"], own
    assert f"{c.hostname}'s own link" in own["title"], own
    assert cut - 3 * BEAT_S <= own["since"] <= cut + 1.0, (cut, own)
