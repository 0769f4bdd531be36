"""Watch a job through ``ddptop.api.watch`` and print each look's resource forecasts, one JSON line a look.

``python tests/watch_resources.py JOB [SECONDS]``, in the job's environment (its runtime dir).
Each line: ``{"t": wall clock, "running": ranks running, "alive": ranks not ended, "statuses":
[...], "findings": [[kind, severity, ranks,
eta_s, resource, title], ...]}`` for the ``*_exhaustion`` findings only. Waits for the job to appear,
ends with the job (or after SECONDS, 300 by default). Run and stopped by tests/test_resource_e2e.py.
"""

from __future__ import annotations

import json
import sys
import time

from ddptop import api
from ddptop.errors import DdptopError
from ddptop.status import ENDED

KINDS = ("memory_exhaustion", "shm_exhaustion", "disk_exhaustion")


def main() -> int:
    job, limit = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
    end = time.monotonic() + limit
    ran = False  # a job seen before its ranks run reads as ended: looked at again until they do
    while time.monotonic() < end:
        began = time.monotonic()
        try:
            for look in api.watch(job, every=1.0):
                found = [[f.kind, f.severity, f.ranks, f.forecast.eta_s if f.forecast else None,
                          f.forecast.resource if f.forecast else "", f.title]
                         for f in look.findings.findings if f.kind in KINDS]
                running = sum(1 for s in look.snapshot.ranks if s.status == "running")
                # Alive: running, or late with a sample on a loaded machine (stale), not ended
                alive = sum(1 for s in look.snapshot.ranks if s.status not in ENDED)
                ran = ran or running > 0
                if ran:
                    print(json.dumps({"t": time.time(), "running": running, "alive": alive,
                                      "statuses": sorted(str(s.status) for s in look.snapshot.ranks),
                                      "findings": found}), flush=True)
                if time.monotonic() > end:
                    return 0
                # api.watch connects to the ranks published when it starts: one that published
                # later (still importing torch on a loaded machine) is never seen by that watch.
                # Look again, from the job's discovery entries as they are now.
                if len(look.snapshot.ranks) < look.snapshot.job.world_size and time.monotonic() - began > 10:
                    break
            else:
                if ran:
                    return 0
        except DdptopError:  # not started yet, or between its ranks' start and their first state
            pass
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
