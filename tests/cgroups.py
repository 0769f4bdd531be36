"""A memory cgroup of a test's own (v1, else v2), always removed: tests/test_resource_e2e.py and
tests/test_memory_e2e.py start real jobs inside one."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.jobs import wait_until

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


@contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A memory cgroup of this test (v1, else v2) with *limit* and no swap; removed at the end."""
    v1 = (V1 / "cgroup.procs").is_file()
    control = V2 / "cgroup.subtree_control"
    if not v1 and not (control.is_file() and "memory" in control.read_text(errors="replace").split()):
        pytest.skip("no memory cgroup controller (v1 at /sys/fs/cgroup/memory, or v2 delegated here)")
    path = (V1 if v1 else V2) / f"ddptop-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        (path / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit))
    except OSError as exc:
        if path.exists():
            path.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc.strerror or exc}")
    for name, value in (("memory.swappiness", "0"), ("memory.memsw.limit_in_bytes", str(limit)),
                        ("memory.swap.max", "0")):
        try:
            (path / name).write_text(value)
        except OSError:
            pass  # no swap accounting: with no swap on the machine the limit holds anyway
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                subprocess.run(["kill", "-9", pid], check=False, capture_output=True, timeout=10)
            except subprocess.TimeoutExpired:
                pass
        wait_until(lambda: not (path / "cgroup.procs").read_text().split(), 30, "the test cgroup to be empty")
        deadline = time.monotonic() + 10
        while path.exists() and time.monotonic() < deadline:
            try:
                path.rmdir()
            except OSError:
                time.sleep(0.1)
        assert not path.exists(), f"cgroup {path} left behind"
