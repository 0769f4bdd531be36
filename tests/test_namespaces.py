"""Runtime directories in other mount namespaces (#22): the rule that names them, the
capped reader, and a real process with a private /tmp found through /proc/PID/root."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop.client import host_jobs
from ddptop.store import discovery, namespaces
from ddptop.store.discovery import Endpoint


@pytest.mark.parametrize("env", [
    {},
    {"TMPDIR": "/var/tmp"},
    {"XDG_RUNTIME_DIR": "/run/user/7", "TMPDIR": "/var/tmp"},
    {"DDPTOP_RUNTIME_DIR": "/x/rt", "XDG_RUNTIME_DIR": "/run/user/7"},
])
def test_the_rule_for_another_process_is_the_rule_of_runtime_dir(env: dict[str, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DDPTOP_RUNTIME_DIR", "XDG_RUNTIME_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR afresh
    encoded = {k.encode(): v.encode() for k, v in env.items()}
    assert namespaces.runtime_dir_of(encoded, os.getuid()) == str(discovery.runtime_dir(create=False))


def test_entries_in_refuses_links_and_oversized_entries(tmp_path: Path) -> None:
    good = Endpoint(job_id="j", rank=0, world_size=2, host="127.0.0.1", port=1, pid=1, store="h:5")
    discovery.write_entry(good, tmp_path)
    (tmp_path / "j.1.json").symlink_to(tmp_path / "j.0.json")
    (tmp_path / "big.0.json").write_text('{"pad": "' + "x" * (discovery.MAX_ENTRY_BYTES + 1) + '"}')
    (tmp_path / "bad.0.json").write_text("not json")
    assert discovery.entries_in(tmp_path) == [good]


@pytest.fixture
def private_tmp_process() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A process with a tmpfs of its own on /tmp holding one record of job JOB, rank 0 = itself."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private /tmp needs root and unshare")
    job = f"ns{uuid.uuid4().hex[:8]}"
    rt = f"/tmp/ddptop-{os.getuid()}"
    record = (f'{{"job_id": "{job}", "rank": 0, "world_size": 1, "host": "127.0.0.1", "port": 9, '
              '"pid": %s, "scheduler_job": "77.0", "job_name": "jn"}')
    # $$: the shell's pid, which `exec sleep` keeps
    script = (f"mount -t tmpfs tmpfs /tmp && mkdir -m 700 {rt} && printf '{record}' $$ > {rt}/{job}.0.json "
              f"&& echo ready && exec sleep 60")
    # Its environment names no runtime directory: /tmp/ddptop-UID, in its own /tmp.
    env = {k: v for k, v in os.environ.items() if k not in ("DDPTOP_RUNTIME_DIR", "XDG_RUNTIME_DIR")}
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, start_new_session=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield proc, job
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_record_in_a_private_tmp_is_found_and_alive_while_its_process_lives(
        private_tmp_process: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, job = private_tmp_process
    found = host_jobs.scan()
    assert [e.pid for e in found.live.get(job, [])] == [proc.pid], (found.live.keys(), found.hidden.keys())
    hidden = found.hidden[job]
    assert str(hidden.path).startswith("/proc/") and hidden.same_network
    assert found.every[job][0].scheduler_job == "77.0" and found.every[job][0].job_name == "jn"
    assert not host_jobs.scan(elsewhere=False).every.get(job), "the job leaked into our own /tmp"
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while job in host_jobs.scan().live and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job not in host_jobs.scan().live  # its namespace is gone with it
