"""Publish a rank's endpoint into the job's own TCPStore (MASTER_ADDR:MASTER_PORT).

A viewer on any node can then read ``ddptop/endpoint/<rank>`` from the store and
reach every rank of a multi-node job (``ddptop snapshot HOST:PORT``). Runs on the
reporter thread, once, after the default process group exists.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

from ddptop.discovery import Endpoint

log = logging.getLogger(__name__)

KEY_PREFIX = "ddptop/endpoint/"
WORLD_KEY = "ddptop/world_size"


def publish_endpoint(endpoint: Endpoint, timeout_s: float) -> bool:
    """Set this rank's endpoint key; False (logged at debug) if the store refuses."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return False
    try:
        from torch.distributed import TCPStore

        store = TCPStore(host, int(port), is_master=False,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        store.set(KEY_PREFIX + str(endpoint.rank), endpoint.to_json())
        store.set(WORLD_KEY, str(endpoint.world_size))
        return True
    except Exception as exc:
        log.debug("ddptop: could not publish endpoint to %s:%s: %s", host, port, exc)
        return False
