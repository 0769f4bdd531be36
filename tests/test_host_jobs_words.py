"""Where a viewer looked, as it tells someone whose job it cannot reach (pure, no namespaces)."""

from __future__ import annotations

from pathlib import Path

from ddptop.client.host_jobs import HostJobs, where_we_looked
from ddptop.store.namespaces import HiddenDir


def _elsewhere(pid: int) -> HiddenDir:
    return HiddenDir(path=Path(f"/proc/{pid}/root/tmp/ddptop-0"), inner="/tmp/ddptop-0", pid=pid,
                     same_network=False)


def test_the_job_asked_for_is_the_one_named_among_several_in_other_networks() -> None:
    found = HostJobs(live={}, every={}, other_network={"1.0": _elsewhere(11), "ctr7": _elsewhere(22)},
                     looked_into=2)
    assert "job ctr7 runs in another network namespace (pid 22's)" in where_we_looked(found, "ctr7")
    assert "job ctr7 runs" in where_we_looked(found, "ctr")  # a prefix, as `ddptop attach ctr` takes
    # Asked for none of them (or nothing): the first by id, so the way in is still said.
    assert "job 1.0 runs in another network namespace (pid 11's)" in where_we_looked(found, "zzz")
    assert "job 1.0 runs" in where_we_looked(found)
    assert "in 2 private /tmp of other mount namespaces" in where_we_looked(found)
