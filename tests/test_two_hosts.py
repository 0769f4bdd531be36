"""Multi-node for real, on one machine: 4 ranks on 2 hosts joined by a veth pair.

Each host (a network namespace with its own hostname, which the other cannot resolve, as in
most containers) runs ``ddptop launch --bind 0.0.0.0`` over ``torchrun --nnodes 2`` with a
shared ``DDPTOP_TOKEN``; the job's TCPStore is on host a. Shown, from either host, through
``ddptop snapshot MASTER_ADDR:PORT`` only: all 4 ranks (ranks advertise the address that
routes to MASTER_ADDR, not their hostname), reached through one connection per node (the
node agents), and straight to every rank with ``DDPTOP_VIA=ranks``; a viewer without the
token, or with a wrong one, told "refused" rather than "did not answer"; and the loss of a whole host, named.
Skipped, with the reason, where network namespaces cannot be created.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptop.proctree import stop_tree
from tests.jobs import BIN, PROBES, ddptop_cmd
from tests.netns import Host, host_env, two_hosts, unavailable
from tests.ports import namespace_port

pytestmark = pytest.mark.slow

WHY_NOT = unavailable()
TOKEN = "two-hosts-test-token"


@pytest.fixture
def job_on_two_hosts(tmp_path: Path) -> Iterator[tuple[Host, Host, str, dict[str, dict[str, str]]]]:
    """The running job; yields (host a, host b, MASTER_ADDR:PORT, env by host). Always cleaned up."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    port = namespace_port()
    job_id = f"t2h{os.getpid()}"
    procs: list[subprocess.Popen[bytes]] = []
    base = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PROBE_SECONDS="90",
                PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    base.pop("DDPTOP_TOKEN", None)
    with two_hosts() as (a, b):
        envs: dict[str, dict[str, str]] = {}
        try:
            for node_rank, host in enumerate((a, b)):
                rt = tmp_path / f"rt-{node_rank}"
                rt.mkdir(mode=0o700)
                env = host_env(base, host, rt)
                envs[host.netns] = env
                torchrun = [str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(node_rank),
                            "--nproc-per-node", "2", "--master-addr", a.address, "--master-port", str(port)]
                cmd = ddptop_cmd("launch", "--bind", "0.0.0.0", "--job-id", job_id, "--interval", "0.5", "--",
                                 *torchrun, str(PROBES / "healthy.py"))
                procs.append(host.popen(cmd, tmp_path / f"host-{node_rank}.log",
                                        {**env, "DDPTOP_TOKEN": TOKEN}))
            yield a, b, f"{a.address}:{port}", envs
        finally:
            for proc in procs:
                stop_tree(proc)
            for i in range(2):
                log = tmp_path / f"host-{i}.log"
                if log.exists():
                    print(f"--- host {i}:\n{log.read_text(errors='replace')[-3000:]}")


def snapshot(host: Host, target: str, env: dict[str, str], token: str | None) -> tuple[int, Any, str]:
    """`ddptop snapshot --json TARGET` run on *host*: (exit code, parsed JSON or None, stderr)."""
    full = dict(env)
    if token is not None:
        full["DDPTOP_TOKEN"] = token
    res = host.run(ddptop_cmd("snapshot", "--json", "--timeout", "2", target), full, timeout=90)
    try:
        doc = json.loads(res.stdout) if res.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    return res.returncode, doc, res.stderr


def wait_all_ranks(host: Host, target: str, env: dict[str, str], timeout: float = 120.0) -> dict[str, Any]:
    """Poll snapshots from *host* until all 4 ranks answer (bounded)."""
    deadline = time.monotonic() + timeout
    last: tuple[int, Any, str] = (0, None, "")
    while time.monotonic() < deadline:
        last = snapshot(host, target, env, TOKEN)
        rc, doc, _ = last
        if rc == 0 and doc and len(doc["ranks"]) == 4 and all(r["status"] == "running" for r in doc["ranks"]):
            return dict(doc)
        time.sleep(0.5)
    raise AssertionError(f"4 running ranks never seen from {host.hostname}: rc={last[0]} {last[2]}\n"
                         f"{json.dumps(last[1])[:2000]}")


def test_four_ranks_on_two_hosts_seen_from_either_token_enforced_host_loss_named(
        job_on_two_hosts: tuple[Host, Host, str, dict[str, dict[str, str]]]) -> None:
    a, b, target, envs = job_on_two_hosts
    for host in (b, a):
        doc = wait_all_ranks(host, target, envs[host.netns])
        assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2, 3]
        assert {r["rank"]: r["host"] for r in doc["ranks"]} == {
            0: a.hostname, 1: a.hostname, 2: b.hostname, 3: b.hostname}
        # Through the node agents (the default for HOST:PORT): one connection per node, so
        # every rank serves one peer, its own agent.
        assert [r["reporter"]["clients"] for r in doc["ranks"]] == [1, 1, 1, 1], doc["ranks"]
    # Straight to every rank, as before agents served: still possible, from either host.
    rc, doc, err = snapshot(b, target, {**envs[b.netns], "DDPTOP_VIA": "ranks"}, TOKEN)
    assert rc == 0 and sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2, 3], err
    # Without the token, or with a wrong one: every rank refuses, and says so.
    for token in (None, "not-the-token"):
        rc, _, err = snapshot(b, target, envs[b.netns], token)
        lines = err.strip().splitlines()
        assert rc == 3 and len(lines) == 1 and "Traceback" not in err, err
        assert "4 rank(s) refused us, wrong or missing token" in lines[0], err
        assert "did not answer" not in lines[0], err
    # Host b vanishes from the network: from host a, its ranks are named as a lost host.
    b.link(up=False)
    rc, doc, err = snapshot(a, target, envs[a.netns], TOKEN)
    assert rc == 3, err
    assert sorted(int(r) for r in doc["job"]["unreachable"]) == [2, 3], doc
    assert f"none of host {b.hostname} at {b.address}'s ranks (2-3) answered" in err, err
