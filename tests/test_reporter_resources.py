"""The reporter's resource reads: the binding memory cgroup (v1 and v2 layouts, a container's limit on
an ancestor), the checkpoint filesystem, and what a sample carries of them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop.agent.oom import MemoryWatch
from ddptop.proctree import stop_tree
from ddptop.protocol import RankState, Sample
from ddptop.reporter.resources import SAVES, ResourceReader, cgroup_levels, disk_use, tightest
from tests.cgroups import memory_cgroup
from tests.jobs import ROOT

MIB = 1 << 20


def _cgroup(root: Path, rel: str, usage: str, limit: str, v2: bool) -> None:
    where = root.joinpath(*[p for p in rel.split("/") if p])
    where.mkdir(parents=True, exist_ok=True)
    (where / ("memory.current" if v2 else "memory.usage_in_bytes")).write_text(usage + "\n")
    (where / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(limit + "\n")


def test_v2_the_ancestor_with_the_tightest_limit_binds(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    _cgroup(tmp_path, "", "900000000", "max", v2=True)
    _cgroup(tmp_path, "kubepods/pod1", "300000000", str(512 * MIB), v2=True)
    _cgroup(tmp_path, "kubepods/pod1/ctr", "200000000", "max", v2=True)
    levels = cgroup_levels("0::/kubepods/pod1/ctr\n", tmp_path)
    assert [lv.path for lv in levels] == ["/kubepods/pod1/ctr", "/kubepods/pod1", "/"]  # /kubepods: no files
    level, limit = tightest(levels)
    assert level is not None and level.path == "/kubepods/pod1" and limit == 512 * MIB


def test_v1_memory_controller_and_no_limit(tmp_path: Path) -> None:
    _cgroup(tmp_path / "memory", "job/rank", "123", "9223372036854771712", v2=False)
    levels = cgroup_levels("4:memory:/job/rank\n3:cpu:/\n", tmp_path)
    assert levels and levels[0].path == "/job/rank"
    level, limit = tightest(levels)
    assert level is not None and level.path == "/job/rank" and limit is None  # v1's "no limit"


def test_no_memory_cgroup_is_none(tmp_path: Path) -> None:
    assert cgroup_levels("3:cpu:/\n", tmp_path) == []
    assert tightest([]) == (None, None)


def test_disk_use_of_a_directory_not_made_yet(tmp_path: Path) -> None:
    use = disk_use(str(tmp_path / "not" / "yet"))
    st = os.statvfs(tmp_path)
    assert use is not None and os.path.ismount(use.mount)
    assert use.total == use.used + st.f_bavail * st.f_frsize


def test_fill_reads_this_process_and_the_sample_carries_it(tmp_path: Path) -> None:
    reader = ResourceReader(checkpoint_dir=str(tmp_path))
    state = RankState(rank=0, local_rank=0, world_size=1, host="h", pid=os.getpid(),
                      mem_total_bytes=8 << 30, mem_available_bytes=6 << 30)
    reader.fill(state, saved_to="", slow_ok=True, torch_ready=False)
    assert state.disk_path == str(tmp_path) and state.disk_total_bytes and state.disk_used_bytes is not None
    if Path("/proc/self/cgroup").read_text().strip() and state.cgroup_path:
        assert state.cgroup_memory_bytes and state.cgroup_memory_bytes > 0  # this process is in it
    sample = Sample.of(state, 1.0)
    assert sample.disk_used_bytes == state.disk_used_bytes
    assert sample.cgroup_memory_bytes == state.cgroup_memory_bytes
    assert sample.host_memory_used_bytes == 2 << 30
    # torch.save's directory, once seen, is read at once (not at the next slow read)
    other = tmp_path / "ckpt"
    reader2 = ResourceReader()
    reader2.fill(state, saved_to="", slow_ok=True, torch_ready=False)
    assert state.disk_path == "" and state.disk_total_bytes is None
    reader2.fill(state, saved_to=str(other), slow_ok=False, torch_ready=False)
    assert state.disk_path == str(other) and state.disk_total_bytes


def test_slow_reads_wait_their_turn(tmp_path: Path) -> None:
    reader = ResourceReader(checkpoint_dir=str(tmp_path))
    assert reader.refresh(100.0)
    assert not reader.refresh(101.0)
    assert reader.refresh(106.0)


def test_an_older_sample_decodes_with_the_new_fields_unknown() -> None:
    import msgspec

    old = [1.0, 5, 0, 5, 10, 0.1, 0.0, 2, 100.0, 1 << 30, None]  # the 11 fields before #48
    sample = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Sample)
    assert sample.rss_bytes == 1 << 30
    assert sample.cgroup_memory_bytes is None and sample.disk_used_bytes is None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MiB tmpfs of this test's own, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("a small disk is a real tmpfs here: mounting one needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)


def test_a_filesystems_first_read_is_its_baseline_even_mid_save(small_disk: Path) -> None:
    reader = ResourceReader()
    state = RankState(rank=0, local_rank=0, world_size=1, host="h", pid=os.getpid())
    SAVES.started += 1  # the first save to it has begun: its directory is known from it
    try:
        reader.fill(state, saved_to=str(small_disk), slow_ok=False, torch_ready=False)
    finally:
        SAVES.returned += 1
    assert len(state.disk_levels) == 1  # else the first save would be no rise


def test_a_save_that_returned_is_read_at_the_next_sample_and_kept_as_a_level(small_disk: Path) -> None:
    reader = ResourceReader()
    state = RankState(rank=0, local_rank=0, world_size=1, host="h", pid=os.getpid())
    reader.fill(state, saved_to=str(small_disk), slow_ok=True, torch_ready=False)
    assert len(state.disk_levels) == 1 and state.disk_total_bytes
    for k in range(1, 4):
        SAVES.started += 1
        (small_disk / f"ck{k}.pt").write_bytes(b"\1" * (3 * MIB))
        # written, not returned yet: read on the slow cadence, but half a save is no level
        reader.refresh(force=True)
        reader.fill(state, saved_to=str(small_disk), slow_ok=False, torch_ready=False)
        assert len(state.disk_levels) == k
        SAVES.returned += 1
        reader.fill(state, saved_to=str(small_disk), slow_ok=False, torch_ready=False)  # not due: read anyway
        assert len(state.disk_levels) == k + 1, state.disk_levels
        assert state.disk_levels[-1][1] - state.disk_levels[-2][1] >= 3 * MIB
    # a write under a step's size moves no level; the levels are the state's own list, shared as is
    (small_disk / "log.txt").write_bytes(b"x" * 4096)
    SAVES.started += 1
    SAVES.returned += 1
    levels = state.disk_levels
    reader.fill(state, saved_to=str(small_disk), slow_ok=False, torch_ready=False)
    assert state.disk_levels is levels


_MOVED = """
import sys, time
from ddptop.reporter.resources import ResourceReader
reader = ResourceReader()
reader.refresh(force=True)
print(reader.cgroup_path, reader.cgroup_limit, flush=True)
sys.stdin.readline()
reader.refresh(now=time.monotonic() + 60)  # the slow cadence, due
print(reader.cgroup_path, reader.cgroup_limit, reader.cgroup_usage() is not None, flush=True)
"""


def test_a_process_moved_into_a_memory_cgroup_is_bound_by_it_from_the_next_slow_read() -> None:
    with memory_cgroup(768 * MIB) as cg:
        child = subprocess.Popen([sys.executable, "-c", _MOVED], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, start_new_session=True,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)))
        try:
            assert child.stdout is not None and child.stdin is not None
            before = child.stdout.readline().split()
            assert before and before[0] != f"/{cg.name}", before
            (cg / "cgroup.procs").write_text(str(child.pid))
            child.stdin.write("\n")
            child.stdin.flush()
            after = child.stdout.readline().split()
            assert after == [f"/{cg.name}", str(768 * MIB), "True"], (before, after)
            assert child.wait(timeout=30) == 0
        finally:
            stop_tree(child)


def test_the_node_agent_follows_a_rank_into_the_cgroup_it_was_moved_to() -> None:
    with memory_cgroup(512 * MIB) as cg:
        sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            watch = MemoryWatch()
            watch.watch(0, sleeper.pid)
            (cg / "cgroup.procs").write_text(str(sleeper.pid))
            watch.follow(0, sleeper.pid)
            sleeper.kill()
            sleeper.wait(timeout=30)
            # killed from outside, not by the kernel: no OOM kill, but the limit of where it was
            verdict = watch.verdict(0, sleeper.pid, "SIGKILL")
            assert verdict.cause == "" and verdict.limit_bytes == 512 * MIB, verdict
        finally:
            stop_tree(sleeper)


def test_a_directory_known_from_a_save_that_returned_starts_from_the_use_before_it(small_disk: Path) -> None:
    # the directory became known from a save the reporter read only once it had returned: the
    # level before it is the use less the file it wrote (else that first save would be no rise)
    ckpt = small_disk / "step1.pt"
    ckpt.write_bytes(b"\1" * (4 * MIB))
    SAVES.path, SAVES.started_at = str(ckpt), 123.0
    reader = ResourceReader()
    state = RankState(rank=0, local_rank=0, world_size=1, host="h", pid=os.getpid())
    try:
        reader.fill(state, saved_to=str(small_disk), slow_ok=False, torch_ready=False)
    finally:
        SAVES.path = ""
    (t0, before), (_, after) = state.disk_levels
    assert t0 == 123.0 and after - before == 4 * MIB, state.disk_levels
