"""A job in a container's own /tmp, watched from the host's shell (#22).

The "container" is what a container runtime makes of a job, minus the image: a mount
namespace of its own with a fresh tmpfs on /tmp (``unshare --mount`` + ``mount -t tmpfs``),
and, in the second test, a network namespace of its own too. Inside, ``ddptop launch --
torchrun`` as a person would run it, with no ``DDPTOP_RUNTIME_DIR``: its records, the
job's generated token and its black box live in the container's /tmp.

Outside, in the host's own /tmp, a viewer finds the job through /proc/PID/root (reads only),
with its token, and shows every rank; where the container has its own network, it says in
one line that the ranks cannot be reached from here and how to look from inside, and that
advice works. Skipped with the reason where the machine cannot make namespaces (not root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptop.proctree import stop_tree
from ddptop.store import discovery, proc_start
from ddptop.store.discovery import Endpoint
from tests.jobs import BIN, PROBES, ROOT, ddptop_cmd

pytestmark = pytest.mark.slow


def _why_not() -> str:
    if os.geteuid() != 0:
        return "a private /tmp for a test job needs root (unshare --mount, mount -t tmpfs)"
    missing = [t for t in ("unshare", "nsenter", "ip") if shutil.which(t) is None]
    return f"{', '.join(missing)} not installed" if missing else ""


WHY_NOT = _why_not()


def _env(**extra: str) -> dict[str, str]:
    """The container's: no DDPTOP_RUNTIME_DIR nor XDG_RUNTIME_DIR, so /tmp/ddptop-UID, its own /tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPTOP_") and k != "XDG_RUNTIME_DIR"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               **extra)
    return env


def _host_env() -> dict[str, str]:
    """The host's shell: its own runtime directory (the test session's, never the machine's:
    tests are hermetic, tests/hermetic.py), where the container's records are not."""
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def _plant_an_ended_job(job_id: str) -> None:
    """What a host that ran a job of this id before keeps (#49): the four entries of an ended
    job of the same id in the host's runtime directory, one pid gone, one taken by a later
    process (this test's own), written by the product's own writer."""
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    an_hour_ago = time.time() - 3600
    for rank, pid in enumerate([gone.pid, gone.pid, os.getpid(), gone.pid]):
        discovery.write_entry(Endpoint(job_id=job_id, rank=rank, world_size=4, host="host-of-old",
                                       port=45000 + rank, pid=pid, start_time=an_hour_ago, node="host-of-old",
                                       proc_start=proc_start.own_start_ticks() + 1))


@pytest.fixture
def container(tmp_path: Path, runtime_dir: Path,
              request: pytest.FixtureRequest) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A 4-rank job under ``ddptop launch`` in a private /tmp (and a private network when the
    test is parametrised so); yields (job id, the namespace's first process). The host's
    shell has *runtime_dir* as its own, which holds an ended job of the same id."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    own_network = bool(getattr(request, "param", False))
    job_id = f"ctr{uuid.uuid4().hex[:8]}"
    _plant_an_ended_job(job_id)
    inner = ddptop_cmd("launch", "--job-id", job_id, "--interval", "0.25", "--", str(BIN / "torchrun"),
                       "--standalone", "--nproc-per-node", "4", str(PROBES / "healthy.py"))
    # The image: the checkout (and its .venv) stays visible at its path even where it lies
    # under /tmp (a CI clone). It is bound to a scratch tmpfs on /mnt (this namespace's
    # own) before the tmpfs covers /tmp, then moved back to its path.
    tmpfs = "mount -t tmpfs tmpfs /tmp"
    if ROOT.is_relative_to("/tmp"):
        tmpfs = (f'mount -t tmpfs tmpfs /mnt && mkdir /mnt/keep && mount --bind "{ROOT}" /mnt/keep && {tmpfs}'
                 f' && mkdir -p "{ROOT}" && mount --move /mnt/keep "{ROOT}" && umount /mnt')
    setup = tmpfs + (" && ip link set lo up" if own_network else "")
    argv = ["unshare", "--mount", "--propagation", "private", *(["--net"] if own_network else []),
            "sh", "-c", f'{setup} && exec "$@"', "container", *inner]
    log = tmp_path / "container.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=_env(PROBE_SECONDS="120"), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield job_id, proc
    finally:
        stop_tree(proc)
        print(log.read_text(errors="replace")[-3000:])


def _snapshot(job_id: str, prefix: list[str] | None = None) -> tuple[int, Any, str]:
    res = subprocess.run([*(prefix or []), *ddptop_cmd("snapshot", "--json", "--timeout", "2", job_id)],
                         env=_env() if prefix else _host_env(), capture_output=True, text=True, timeout=60,
                         check=False)
    doc = json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else None
    return res.returncode, doc, res.stderr


def _wait_training(job_id: str, prefix: list[str] | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    last = ""
    while time.monotonic() < deadline:
        _rc, doc, err = _snapshot(job_id, prefix)
        last = err.strip()
        if doc and sorted(r["rank"] for r in doc["ranks"] if r["status"] == "running" and r["step"] > 0) \
                == [0, 1, 2, 3]:
            return dict(doc)
        time.sleep(0.5)
    raise AssertionError(f"four training ranks of {job_id} never seen: {last}")


def test_a_job_in_a_private_tmp_is_found_from_the_hosts_shell(
        container: tuple[str, subprocess.Popen[bytes]]) -> None:
    job_id, _proc = container
    doc = _wait_training(job_id)
    assert doc["job"]["id"] == job_id and not doc["job"]["unreachable"], doc["job"]
    # The host's own directory held an ended job of the same id (#49): live beats stale.
    assert {r["host"] for r in doc["ranks"]} != {"host-of-old"}, doc["ranks"]
    # Not from the host's /tmp: nothing of the job is there.
    assert not list(Path(f"/tmp/ddptop-{os.getuid()}").glob(f"{job_id}.*")), "records leaked into /tmp"
    res = subprocess.run(ddptop_cmd("jobs", "--all", "--json"), env=_host_env(), capture_output=True,
                         text=True, timeout=60, check=False)
    rows = [r for r in json.loads(res.stdout)["jobs"] if r["job_id"] == job_id]
    assert [(r["state"], r["alive"]) for r in rows] == [("ended", 0), ("running", 4)], rows
    assert rows[1]["runtime_dir"].startswith("/proc/") and rows[0]["hosts"] == ["host-of-old"], rows


@pytest.mark.parametrize("container", [True], indirect=True, ids=["own-network"])
def test_a_job_in_its_own_network_is_named_with_the_way_in(
        container: tuple[str, subprocess.Popen[bytes]]) -> None:
    job_id, proc = container
    deadline = time.monotonic() + 120
    err = ""
    while time.monotonic() < deadline:
        rc, _doc, err = _snapshot(job_id)
        # Another test's job may run in its own network too: wait for this one's name.
        if f"job {job_id} runs in another network namespace" in err:
            break
        time.sleep(0.5)
    lines = err.strip().splitlines()
    assert rc != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert f"job {job_id} runs in another network namespace" in lines[0] and "nsenter -t" in lines[0], err
    # The advice, followed: from inside the container's network and mounts, the job is whole.
    pid = lines[0].split("nsenter -t ")[1].split()[0]
    assert _wait_training(job_id, ["nsenter", "-t", pid, "-n", "-m"])["job"]["id"] == job_id
    assert proc.poll() is None
