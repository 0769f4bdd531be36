"""The reporter's resource reads: the binding memory cgroup (v1 and v2 layouts, a container's limit on
an ancestor), the checkpoint filesystem, and what a sample carries of them."""

from __future__ import annotations

import os
from pathlib import Path

from ddptop.protocol import RankState, Sample
from ddptop.reporter.resources import ResourceReader, cgroup_levels, disk_use, tightest

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
