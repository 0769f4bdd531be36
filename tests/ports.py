"""Ports a test hands to another process to listen on (MASTER_PORT, slurmctld's, a probe's).

Why not ``bind(0)`` then close: that port comes from the kernel's ephemeral range, and once
released the kernel hands it to the next ``bind(0)`` or outgoing connection, often a rank's own
ddptop server started a moment before ``init_process_group`` (CI saw torch's store fail with
EADDRINUSE and read ddptop's frame magic from the port the test had picked). A port below the
ephemeral range is never handed out by the kernel, so only another explicit pick could take
it; each pytest-xdist worker picks from a band of its own, so two workers never race either.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_LOWEST = 10000
_TRIES = 500


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _band(workers: int, worker: int, ephemeral_low: int) -> range:
    """This worker's share of [_LOWEST, ephemeral_low)."""
    width = max(1, (ephemeral_low - _LOWEST) // max(1, workers))
    start = _LOWEST + width * (worker % max(1, workers))
    return range(start, min(start + width, ephemeral_low))


def _worker() -> tuple[int, int]:
    """(workers, this worker's index) from pytest-xdist's environment; (1, 0) without it."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    try:
        index = int(name.removeprefix("gw"))
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        return 1, 0
    return max(count, index + 1), index


def unused_port(host: str = "127.0.0.1") -> int:
    """A TCP port on *host*, free now, below the kernel's ephemeral range, in this worker's band."""
    workers, worker = _worker()
    band = _band(workers, worker, _ephemeral_low())
    for _ in range(_TRIES):
        port = random.choice(band)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {band.start}..{band.stop - 1} after {_TRIES} tries")


def namespace_port() -> int:
    """A port for a job inside fresh network namespaces: nothing listens there yet, but the job's
    own processes take ephemeral ports, so it stays below that range."""
    return random.randint(_LOWEST, _ephemeral_low() - 1)
