"""Publish a rank's endpoint into the job's own TCPStore (MASTER_ADDR:MASTER_PORT).

A viewer on any node can then read ``ddptop/endpoint/<rank>`` from the store and
reach every rank of a multi-node job (``ddptop snapshot HOST:PORT``). Runs on the
reporter thread, once, after the default process group exists.

What a rank publishes must be reachable from the other hosts: in containers and pods
hostnames often do not resolve across hosts, while MASTER_ADDR is an address every host
reaches. So a rank serving on every interface advertises the address of its interface
that routes to MASTER_ADDR (:func:`advertise_address`), unless ``DDPTOP_ADVERTISE`` says.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta

from ddptop.reporter.config import ReporterConfig
from ddptop.reporter.identity import slurm_job
from ddptop.store import discovery
from ddptop.store.discovery import STORE_KEY_PREFIX, STORE_WORLD_KEY, Endpoint
from ddptop.store.proc_start import own_start_ticks

log = logging.getLogger(__name__)

WILDCARD_BINDS = frozenset(("0.0.0.0", "::", ""))


AGENT_WAIT_S = 300.0  # how long a rank looks for a node agent spawned after it started


class Announcer:
    """Where this rank says where it serves: its discovery entry and the job's store.

    Under ``ddptop launch`` the ranks know their node agent from the start. With
    ``install()`` alone, local rank 0 spawns the node agent after the ranks started: each rank
    looks for its file once per sample (a failed open, at most :data:`AGENT_WAIT_S`), then
    names it in its discovery entry and in the store, so viewers and the other nodes' agents reach
    this node through it. Runs on the reporter thread; never raises into training.
    """

    def __init__(self, endpoint: Endpoint, store_timeout_s: float) -> None:
        self.endpoint = endpoint
        self._timeout_s = store_timeout_s
        self._published = False
        self._agent_until = 0.0 if endpoint.agent_port else time.monotonic() + AGENT_WAIT_S
        discovery.write_entry(endpoint)

    def tick(self, group_ready: bool) -> None:
        """Once per sample: adopt a node agent that appeared; publish once the group is up."""
        if self._agent_until and time.monotonic() < self._agent_until:
            port = discovery.read_agent_port(self.endpoint.job_id)
            if port:
                self._agent_until = 0.0
                self.endpoint = replace(self.endpoint, agent_port=port)
                discovery.write_entry(self.endpoint)
                if self._published:
                    publish_endpoint(self.endpoint, self._timeout_s)
        if group_ready and not self._published:
            self._published = True  # one try: a store that refuses once will refuse again
            publish_endpoint(self.endpoint, self._timeout_s)


def own_endpoint(cfg: ReporterConfig, port: int, start_time: float, node: str) -> Endpoint:
    """This rank's discovery entry: where it serves, and the names a viewer finds the job by."""
    env = dict(os.environ)
    return Endpoint(
        job_id=cfg.job_id, rank=cfg.rank, world_size=cfg.world_size,
        host=advertise_address(cfg.bind, cfg.advertise, env.get("MASTER_ADDR")), port=port,
        pid=os.getpid(), start_time=start_time, node=node, agent_port=cfg.agent_port,
        store=store_address(env), scheduler_job=slurm_job(env),
        job_name=env.get("SLURM_JOB_NAME", "")[:200] if env.get("SLURM_JOB_ID") else "",
        proc_start=own_start_ticks(),
    )


def store_address(env: Mapping[str, str]) -> str:
    """"MASTER_ADDR:MASTER_PORT", where :func:`publish_endpoint` publishes ("" without them)."""
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def publish_endpoint(endpoint: Endpoint, timeout_s: float) -> bool:
    """Set this rank's endpoint key; False (logged at debug) if the store refuses."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return False
    try:
        from torch.distributed import TCPStore

        store = TCPStore(host, int(port), is_master=False,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        store.set(STORE_KEY_PREFIX + str(endpoint.rank), endpoint.to_json())
        store.set(STORE_WORLD_KEY, str(endpoint.world_size))
        return True
    except Exception as exc:
        log.debug("ddptop: could not publish endpoint to %s:%s: %s", host, port, exc)
        return False


def advertise_address(bind: str, explicit: str, master_addr: str | None) -> str:
    """The host viewers should connect to: *explicit* (``DDPTOP_ADVERTISE``), else a
    specific *bind*, else the local address that routes to *master_addr*, else the hostname."""
    if explicit:
        return explicit
    if bind not in WILDCARD_BINDS:
        return bind
    return route_to(master_addr or "") or socket.gethostname()


def route_to(master_addr: str) -> str:
    """The local address of the interface that routes to *master_addr* ("" if unknown).

    Only for a literal IP: a name would need DNS, which can block for seconds, and this
    runs as the rank starts. A UDP ``connect`` picks the route and sends nothing.
    """
    try:
        target = ipaddress.ip_address(master_addr.strip("[]"))
    except ValueError:
        return ""
    family = socket.AF_INET6 if target.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((str(target), 9))
            return str(probe.getsockname()[0])
    except OSError:
        return ""
