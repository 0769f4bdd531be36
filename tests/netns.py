"""Hosts on one machine: Linux network namespaces joined by veth pairs.

Two hosts are joined by one veth pair; three or more (:func:`hosts`) by a veth pair each
to a bridge in a switch namespace of their own, so nothing is added to the machine's own
network and deleting the namespaces deletes everything.

Each simulated host has its own network stack (an address in 192.0.2.0/24, TEST-NET-1, and
its own loopback) and, through ``unshare --uts``, its own hostname that no other host can
resolve, as in most containers and pods. Processes run in a host with :meth:`Host.popen`.
Names are unique per test; :func:`two_hosts` always deletes what it created (deleting a
namespace deletes its end of the veth, and with it the pair).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUBNET = "192.0.2"  # TEST-NET-1 (RFC 5737): never routed anywhere


@dataclass
class Host:
    """One simulated host: a namespace, its veth end, its address and hostname."""

    netns: str
    ifname: str
    address: str
    hostname: str
    switch: str = ""  # on a switch (hosts()): the switch's namespace and this host's port on it
    port: str = ""

    def command(self, argv: list[str]) -> list[str]:
        """*argv* run inside this host (its network, its hostname)."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostname, *argv]

    def popen(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start *argv* in this host, in a session of its own, output to *log*."""
        with open(log, "wb") as out:
            return subprocess.Popen(self.command(argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def run(self, argv: list[str], env: dict[str, str],
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run *argv* in this host to completion (bounded)."""
        return subprocess.run(self.command(argv), env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def link(self, up: bool) -> None:
        """Bring this host's veth end up or down (down: the host vanishes from the network, and
        its own address with it: even its local processes cannot reach it there)."""
        _ip("netns", "exec", self.netns, "ip", "link", "set", self.ifname, "up" if up else "down")

    def cable(self, connected: bool) -> None:
        """Plug or pull this host's cable: its port on the switch goes down (hosts() only). The
        host keeps its interface and address (no carrier, as with a pulled cable or a dead
        switch port): its processes reach each other there, and nothing else."""
        assert self.switch and self.port, "a cable needs a switch: hosts(), not two_hosts()"
        _ip("netns", "exec", self.switch, "ip", "link", "set", self.port, "up" if connected else "down")


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if res.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def unavailable() -> str:
    """Why two hosts cannot be made here ("" when they can)."""
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"ddpt{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
    except OSError as exc:
        return f"cannot create a network namespace (needs root or CAP_SYS_ADMIN): {exc}"
    try:
        _ip("netns", "del", probe)
    except OSError:
        pass
    return ""


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Hosts ``.1`` and ``.2`` of 192.0.2.0/24, deleted on exit whatever happened."""
    tag = uuid.uuid4().hex[:6]
    hosts = (Host(f"ddpt-{tag}-a", f"vd{tag}a", f"{SUBNET}.1", f"host-a-{tag}"),
             Host(f"ddpt-{tag}-b", f"vd{tag}b", f"{SUBNET}.2", f"host-b-{tag}"))
    created: list[str] = []
    try:
        for host in hosts:
            _ip("netns", "add", host.netns)
            created.append(host.netns)
        a, b = hosts
        _ip("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
        try:
            for host in hosts:
                _ip("link", "set", host.ifname, "netns", host.netns)
        except OSError:
            subprocess.run(["ip", "link", "del", a.ifname], capture_output=True, timeout=30, check=False)
            raise
        for host in hosts:
            _ip("netns", "exec", host.netns, "ip", "addr", "add", f"{host.address}/24", "dev", host.ifname)
            _ip("netns", "exec", host.netns, "ip", "link", "set", host.ifname, "up")
            _ip("netns", "exec", host.netns, "ip", "link", "set", "lo", "up")
        yield hosts
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)


@contextmanager
def hosts(count: int, ifname: str = "") -> Iterator[list[Host]]:
    """Hosts ``.1`` .. ``.count`` of 192.0.2.0/24 on one switch; all deleted on exit.

    With *ifname*, every host's interface has that one name (as ``eth0`` on a real cluster),
    for launchers such as ``srun`` that give every node the same ``GLOO_SOCKET_IFNAME``."""
    tag = uuid.uuid4().hex[:6]
    switch = f"ddpt-{tag}-sw"
    made = [Host(f"ddpt-{tag}-{i}", f"vd{tag}{i}", f"{SUBNET}.{i + 1}", f"host-{chr(97 + i)}-{tag}")
            for i in range(count)]
    created: list[str] = []
    try:
        _ip("netns", "add", switch)
        created.append(switch)
        _ip("netns", "exec", switch, "ip", "link", "add", "br0", "type", "bridge")
        _ip("netns", "exec", switch, "ip", "link", "set", "br0", "up")
        for i, host in enumerate(made):
            _ip("netns", "add", host.netns)
            created.append(host.netns)
            # Both ends are made inside the switch namespace (nothing ever sits in the machine's
            # own), then one end moves to the host.
            port = host.port = f"sw{tag}{i}"
            host.switch = switch
            _ip("netns", "exec", switch, "ip", "link", "add", host.ifname, "type", "veth",
                "peer", "name", port)
            _ip("netns", "exec", switch, "ip", "link", "set", port, "master", "br0")
            _ip("netns", "exec", switch, "ip", "link", "set", port, "up")
            _ip("netns", "exec", switch, "ip", "link", "set", host.ifname, "netns", host.netns)
            if ifname:
                _ip("netns", "exec", host.netns, "ip", "link", "set", host.ifname, "name", ifname)
                host.ifname = ifname
            _ip("netns", "exec", host.netns, "ip", "addr", "add", f"{host.address}/24", "dev", host.ifname)
            _ip("netns", "exec", host.netns, "ip", "link", "set", host.ifname, "up")
            _ip("netns", "exec", host.netns, "ip", "link", "set", "lo", "up")
        yield made
    finally:
        for name in reversed(created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30, check=False)


def host_env(base: dict[str, Any], host: Host, runtime_dir: Path) -> dict[str, str]:
    """Environment of processes on *host*: its own runtime directory, gloo on its veth."""
    env = {k: str(v) for k, v in base.items()}
    env.update(DDPTOP_RUNTIME_DIR=str(runtime_dir), GLOO_SOCKET_IFNAME=host.ifname,
               TP_SOCKET_IFNAME=host.ifname)
    return env
