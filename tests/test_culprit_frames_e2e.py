"""Where the culprit is in the code (#34 item 2), on a real FSDP2 job (fully_shard, 4 gloo ranks).

Rank 2 lingers in Python inside its forward pass (a forward pre-hook that sleeps) while its
peers wait in FSDP's all_gather. The finding that names rank 2 says where it is: the hook's
file, line and function, read in-process by rank 2's own reporter (no signal, no ptrace: it
stays in its hook until released, and the job then finishes).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.jobs import JobRunner, wait_until

pytestmark = pytest.mark.slow


def test_a_rank_lingering_in_a_forward_hook_is_named_with_the_hooks_frame(job_runner: JobRunner,
                                                                           tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = job_runner.start("fw_fsdp2", nproc=4, env={
        "PROBE_LINGER_RANK": "2", "PROBE_LINGER_AT_STEP": "3", "PROBE_RELEASE": str(release),
        "PROBE_SECONDS": "120", "PROBE_TRAIN": "5", "PROBE_EPOCHS": "2"})
    job.wait_log(r"rank 2: step 3: lingering in the forward hook", timeout=90)
    found: list[dict[str, object]] = []

    def named() -> bool:
        res = job.run_cli("doctor", "--json", "--watch", "3", job.job_id, timeout=60)
        found[:] = json.loads(res.stdout or '{"findings": []}')["findings"]
        return any(f["kind"] == "collective_stall" and f["ranks"] == [2]
                   and any("linger_in_forward_hook" in e for e in f["evidence"]) for f in found)

    wait_until(named, 60.0, "rank 2 named with its hook's frame")
    f = next(f for f in found if f["kind"] == "collective_stall" and f["ranks"] == [2])
    line = next(e for e in f["evidence"] if "linger_in_forward_hook" in e)
    assert re.search(r"rank 2 is at probes/fw_fsdp2\.py:\d+ in linger_in_forward_hook", line), line
    assert "read in-process" in line, line
    # Looking changed nothing: released, every rank finishes its training.
    release.touch()
    assert job.wait(timeout=90) == 0, job.log()[-3000:]
