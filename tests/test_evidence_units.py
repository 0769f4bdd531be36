"""The evidence readers on their own: safe unpickling, every damage a dump can have, fuzzing.

The dump fuzzed here is real: a one-rank gloo group in a subprocess runs a few
collectives and writes its Flight Recorder with torch's own serialisers.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddptop.errors import EvidenceError
from ddptop.evidence import frdump, safe_pickle, scan
from ddptop.textfmt import human_duration, op_tensors, op_text, tensor_text

WRITER = """
import os, sys, torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json
os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/store", rank=0, world_size=1)
t = torch.ones(3, 5)
for _ in range(3):
    dist.all_reduce(t)
open(sys.argv[1] + "/dump_0", "wb").write(_dump_fr_trace())
data = _dump_fr_trace_json()
open(sys.argv[1] + "/json_0", "wb").write(data if isinstance(data, bytes) else data.encode())
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def real_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("one-rank")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", WRITER, str(folder)], env=env, capture_output=True, text=True,
                         timeout=120, check=False, start_new_session=True)
    assert res.returncode == 0, res.stderr[-2000:]
    (folder / "store").unlink(missing_ok=True)
    return folder


def test_both_formats_of_a_real_dump_read_alike(real_dumps: Path) -> None:
    a, b = frdump.read_dump(real_dumps / "dump_0"), frdump.read_dump(real_dumps / "json_0")
    assert (a.format, b.format) == ("pickle", "json")
    for dump in (a, b):
        assert dump.rank == 0 and dump.backend == "gloo" and dump.version
        assert [op.collective_seq for op in dump.entries] == [1, 2, 3]
        # gloo marks completion from its own threads: at the dump any of the three may still show
        assert {op.pg_name for op in dump.entries} == {"0"} and dump.progress["0"].last_enqueued == 3
        assert dump.progress["0"].last_completed in (-1, 1, 2, 3)
        assert all(op.input_sizes == [[3, 5]] and op.input_dtypes == ["Float"] for op in dump.entries)
        assert dump.dump_time > 1.6e9
    assert a.entries[-1].frames and a.entries[-1].frames[-1].function  # pickles carry the stack
    assert op_text(_pending(a)) == "all_reduce [3, 5] float32"


def _pending(dump: frdump.RankDump) -> object:
    from ddptop.evidence.fold import groups_of

    return groups_of(dump)[0].recent[-1]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_names_code_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for payload in (pickle.dumps({"entries": [_Evil(marker)]}, protocol=2),
                    pickle.dumps({"version": "2.10", "entries": [], "x": _Evil(marker)}, protocol=4),
                    b"\x80\x02csubprocess\nPopen\n(X\x05\x00\x00\x00touchtR.",
                    pickle.dumps({"version": "2.10", "pg_config": {}, "entries": []}, protocol=0)
                    .replace(b"(dp0", b"cos\nsystem\n(dp0")):
        path = tmp_path / "trace_rank_0"
        path.write_bytes(payload)
        with pytest.raises(EvidenceError) as info:
            frdump.read_dump(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()


def test_truncated_oversized_and_nameless_dumps_are_one_line_errors(real_dumps: Path, tmp_path: Path) -> None:
    data = (real_dumps / "dump_0").read_bytes()
    cut = tmp_path / "rank_1"
    cut.write_bytes(data[: len(data) // 3])
    big = tmp_path / "rank_2"
    big.write_bytes(data)
    nameless = tmp_path / "dump"
    nameless.write_bytes(data)
    for path, kwargs in ((cut, {}), (big, {"max_bytes": 100}), (nameless, {})):
        with pytest.raises(EvidenceError) as info:
            frdump.read_dump(path, **kwargs)
        assert "\n" not in str(info.value) and path.name in str(info.value)


def test_scan_recognises_by_content_and_follows_no_link(real_dumps: Path, tmp_path: Path) -> None:
    folder = tmp_path / "mix"
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "whatever_host-a.7").write_bytes((real_dumps / "dump_0").read_bytes())
    (folder / "notes.txt").write_text("nothing to see\n")
    (folder / "link_3").symlink_to(real_dumps / "dump_0")
    found = scan.gather([folder])
    assert [d.rank for d in found.dumps] == [7]
    assert [p.name for p in found.ignored] == ["notes.txt"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_dumps_raise_only_evidence_errors(real_dumps: Path, data: st.DataObject) -> None:
    for name in ("dump_0", "json_0"):
        raw = bytearray((real_dumps / name).read_bytes())
        for _ in range(data.draw(st.integers(1, 8))):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] = data.draw(st.integers(0, 255))
        raw = raw[: data.draw(st.integers(1, len(raw)))]
        try:
            if raw[:1] == b"\x80":
                safe_pickle.loads(bytes(raw))
            frdump.normalise(frdump._decode(bytes(raw))[0], path="/x/rank_0", fmt="fuzz")
        except EvidenceError as exc:
            assert "\n" not in str(exc)


def test_tensor_text() -> None:
    assert tensor_text([[4, 6922]], "Float") == "[4, 6922] float32"
    assert tensor_text([[2], [3, 3]], "BFloat16") == "[2] + [3, 3] bfloat16"
    # A collective's [inputs, outputs]: outputs shown only where they differ (#21: never
    # "[[[6922]], [[4, 6922]]]"); times under a millisecond never read "0ms".
    assert op_tensors([[[6922]], [[4, 6922]]], "Float") == "[6922] -> [4, 6922] float32"
    assert op_tensors([[[64]], [[64]]], "Float") == "[64] float32" and op_tensors([], "Half") == "float16"
    assert (human_duration(0.0001), human_duration(0.0), human_duration(0.004)) == ("<1ms", "0ms", "4ms")


def test_stderr_tail_passes_everything_through_and_keeps_a_masked_capped_tail(tmp_path: Path) -> None:
    from ddptop.agent.stderr_tail import CONSOLE_FILE, StderrTail

    read_end, write_end = os.pipe()  # stands in for ddptop's own stderr
    tail = StderrTail(tmp_path, cap_bytes=64 * 1024, target_fd=write_end)
    script = ("import sys\n"
              "for i in range(4000):\n"
              "    sys.stderr.write(f'line {i} db password=Hunter2Canary' + chr(10))\n"
              "sys.stderr.write('what():  the end')\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=tail.child_fd)
    tail.child_started()
    tail.start()
    passed = bytearray()
    os.set_blocking(read_end, False)
    while proc.poll() is None or tail._thread.is_alive():
        try:
            passed += os.read(read_end, 1 << 16)
        except BlockingIOError:
            tail.join(0.05)
    tail.join(10)
    os.close(write_end)
    while chunk := os.read(read_end, 1 << 16):
        passed += chunk
    os.close(read_end)
    assert passed.count(b"Hunter2Canary") == 4000 and passed.endswith(b"what():  the end")  # unchanged
    kept = (tmp_path / (CONSOLE_FILE + ".1")).read_bytes() + (tmp_path / CONSOLE_FILE).read_bytes()
    assert b"Hunter2Canary" not in kept and b"password=***" in kept
    assert kept.endswith(b"what():  the end") and b"line 3999 " in kept
    assert len(kept) <= 64 * 1024


@pytest.mark.parametrize("fmt", ["dump_0", "json_0"])
def test_each_groups_last_entries_are_kept_however_deep(real_dumps: Path, tmp_path: Path, fmt: str) -> None:
    """Reading walks back from the newest entry and stops when every configured group has its
    share: a group last used long ago keeps its entries, the busy one keeps only its last."""
    import json

    raw = frdump._decode((real_dumps / fmt).read_bytes())[0]
    template = raw["entries"][-1]
    key = "process_group" if "process_group" in template else "pg_id"

    def entry(group: str, seq: int) -> dict[str, object]:
        moved = (group, "pp") if key == "process_group" else int(group)
        return {**template, key: moved, "collective_seq_id": seq, "record_id": seq}

    rows = [entry("0", i) for i in range(1, 201)] + [entry("1", i) for i in range(1, 4)]
    rows += [entry("0", i) for i in range(201, 301)]
    dump = {**raw, "entries": rows,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"},
                          "1": {"name": "1", "desc": "pp", "ranks": "[0]"}}}
    path = tmp_path / "trace_rank_0"
    if fmt == "json_0":
        path.write_text(json.dumps(dump))
    else:
        path.write_bytes(pickle.dumps(dump, protocol=2))
    read = frdump.read_dump(path)
    assert read.entries_total == 303
    by_group = {g: [op.collective_seq for op in read.entries if op.pg_name == g] for g in ("0", "1")}
    assert by_group["1"] == [1, 2, 3]
    assert by_group["0"] == list(range(300 - frdump.KEEP_PER_GROUP + 1, 301))


LONG_WRITER = """
import os, sys, torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace
dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/store", rank=0, world_size=1)
side = dist.new_group([0])
t = torch.ones(4)
for i in range(300):
    dist.all_reduce(t) if i % 7 else dist.broadcast(t, 0)
for _ in range(70):  # a second group, as busy as the first at the end
    dist.all_reduce(t, group=side)
    dist.all_reduce(t)
open(sys.argv[1] + "/dump_0", "wb").write(_dump_fr_trace())
out = [torch.zeros(4)]
dist.all_gather(out, t)  # an op first seen in the middle of the buffer ...
for _ in range(200):
    dist.all_reduce(t)
dist.all_gather(out, t)  # ... and again among the newest: its name is fetched from the middle
open(sys.argv[1] + "/dump_1", "wb").write(_dump_fr_trace())
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def long_real_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real dumps of 440 and 642 entries in two groups, written by torch's own (C++) pickler."""
    folder = tmp_path_factory.mktemp("long-dump")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", LONG_WRITER, str(folder)], env=env, capture_output=True,
                         text=True, timeout=120, check=False, start_new_session=True)
    assert res.returncode == 0, res.stderr[-2000:]
    return folder


def test_only_the_newest_entries_are_unpickled_and_the_result_is_exact(long_real_dumps: Path) -> None:
    """The tail shortcut on torch's own pickle gives the same dump as unpickling all of it; where
    the newest entries fetch a string first written in the skipped middle (an op, a group
    first run there), that cut says no and a longer one is read: still the same."""
    from ddptop.evidence import pickle_tail

    for name, taken in (("dump_0", True), ("dump_1", True)):
        path = long_real_dumps / name
        data = path.read_bytes()
        full = frdump.normalise(safe_pickle.loads(data), path=str(path), fmt="pickle")
        fast = frdump.read_dump(path)
        assert (fast.entries_total, fast.entries, fast.groups, fast.progress) == (
            full.entries_total, full.entries, full.groups, full.progress), name
        assert {op.pg_name for op in fast.entries} == {"0", "1"}
        assert fast.entries_total == {"dump_0": 440, "dump_1": 642}[name]
        assert (frdump._decode_pickle_tail(data, frdump.KEEP_PER_GROUP) is not None) is taken, name
        reader = pickle_tail.TailReader(data)
        assert reader.total == fast.entries_total
        # The newest 150 of dump_0 hold the side group's first op; those of dump_1 fetch
        # "gloo:all_gather", first written 200 entries back.
        tail = reader.last(150)
        assert (tail is None) is (name == "dump_1"), name
        if tail is not None:
            assert [e["record_id"] for e in tail] == list(range(reader.total - 150, reader.total))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_long_dumps_read_the_newest_entries_or_raise_only_evidence_errors(
        long_real_dumps: Path, data: st.DataObject) -> None:
    """Damage in a dump long enough for the tail shortcut: a one-line refusal or a dump, never
    another exception, and whatever the shortcut returns is what unpickling all of it gives."""
    raw = bytearray((long_real_dumps / "dump_0").read_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(len(raw) // 2, len(raw) - 1))  # among the newest entries
        raw[at] = data.draw(st.integers(0, 255))
    damaged = bytes(raw)
    try:
        fast = frdump.normalise(frdump._decode(damaged)[0], path="/x/rank_0", fmt="fuzz")
    except EvidenceError as exc:
        assert "\n" not in str(exc)
        return
    try:
        full = frdump.normalise(safe_pickle.loads(damaged), path="/x/rank_0", fmt="fuzz")
    except EvidenceError:
        return  # the whole file cannot be read where the newest part could: no comparison
    assert fast.entries == full.entries


def test_a_memo_bomb_is_refused_in_one_line_not_by_the_oom_killer(tmp_path: Path) -> None:
    """A 4-byte memo index makes the C unpickler allocate and zero a table of that size (16 GB
    here): refused as a MemoryError under the address-space cap, the process unharmed."""
    bomb = tmp_path / "comm_lib_trace_rank_0"
    bomb.write_bytes(b"\x80\x02}(X\x07\x00\x00\x00entries](}r\xff\xff\xff\x7f(eu.")
    with pytest.raises(EvidenceError) as caught:
        frdump.read_dump(bomb)
    assert "MemoryError" in str(caught.value) and "\n" not in str(caught.value)
    import resource

    assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY  # restored


NCCL_H100 = Path(__file__).resolve().parent / "data" / "nccl_h100"


def test_a_real_nccl_dump_and_watchdog_line_from_an_h100_are_read_and_named() -> None:
    """NCCL's own artefacts (tests/data/nccl_h100/README.md: one H100, torch 2.11, NCCL
    2.28.9): its pickled Flight Recorder dump normalises to NCCL's ops, and `doctor` on the
    dump and torchrun's log names the timed-out all-reduce and the aborted rank."""
    dump = frdump.read_dump(NCCL_H100 / "fr_trace_rank_0")
    assert (dump.rank, dump.format, dump.backend) == (0, "pickle", "nccl"), dump
    last = dump.entries[-1]
    assert (last.op, last.collective_seq, last.input_sizes) == ("nccl:all_reduce", 6, [[4096]]), last
    assert dump.progress["0"].last_enqueued == 6, dump.progress
    argv = [sys.executable, "-m", "ddptop", "doctor", "--json", str(NCCL_H100 / "fr_trace_rank_0"),
            str(NCCL_H100 / "torchrun.log")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    kinds = {f["kind"]: f for f in json.loads(res.stdout)["findings"]}
    assert "ALLREDUCE of 4096 elements at seq 6" in kinds["collective_stall"]["title"], kinds
    # The rank NCCL aborted is the timeout's victim, told as such (#33: one story, no second cause).
    lost = kinds["rank_lost"]
    assert (lost["severity"], lost["ranks"], lost["victims"]) == ("info", [], [0]), kinds
    assert "NCCL took rank 0 down" in lost["title"] and kinds["collective_stall"]["victims"] == [0], kinds
