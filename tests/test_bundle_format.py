"""The bundle format without jobs: round trip, seeking, truncation, hostile files, secrets."""

from __future__ import annotations

import gzip
import struct
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from ddptop.bundle import format as fmt
from ddptop.bundle.format import CrashFile, Manifest
from ddptop.bundle.reader import load_model, read_file
from ddptop.bundle.replay_source import ReplaySource
from ddptop.bundle.writer import BundleWriter
from ddptop.errors import BundleError
from ddptop.protocol import HistoryMsg, RecordEntry, Sample
from ddptop.testing.bundles import BASE_ENV, bundle_events, recording_events
from ddptop.wire import LENGTH, header_bytes
from tests.jobs import ddptop_cmd

CANARIES = {"HF_TOKEN": "hf_canaryAAAA1111BBBB2222", "MY_API_KEY": "canary-my-api-key-3333",
            "WANDB_API_KEY": "canarywandb4444cccc5555dddd6666eeee",
            "TORCH_CANARY_NOTE": "sk-canary55556666777788"}


def _manifest(kind: str = "recording", world: int = 4, **kw: object) -> Manifest:
    return Manifest(schema_version=fmt.SCHEMA_VERSION, kind=kind, created=time.time(),  # type: ignore[arg-type]
                    job_id="j1", world_size=world, ddptop_version="0.1.0", **kw)  # type: ignore[arg-type]


def _recording(path: Path, close: bool = True) -> None:
    writer = BundleWriter(path, _manifest(), flush_interval_s=0.0)  # one member per frame
    for event in recording_events(4, 30, crash_rank=2, crash_at=12):
        writer.write(event)
    if close:
        writer.close("test")
    else:
        writer.flush()


def _raw(frames: list[object], version: int = 1) -> bytes:
    out = header_bytes(version)
    for frame in frames:
        payload = fmt.encoder.encode(frame)
        out += LENGTH.pack(len(payload)) + payload
    return out


def test_round_trip_and_seek(tmp_path: Path) -> None:
    path = tmp_path / "r.ddptop"
    _recording(path)
    source = ReplaySource(path, checkpoint_every=7)
    assert source.warnings == [] and source.manifest.kind == "recording"
    crash_t = 1_700_000_000.0 + 12
    assert source.model_at(crash_t - 1).ranks[2].status(crash_t - 1) == "running"
    assert source.model_at(crash_t + 0.5).ranks[2].status(crash_t + 0.5) == "crashed"
    # Seeking by checkpoint gives exactly the model a full fold gives.
    for t in source.event_times()[::9]:
        full = ReplaySource(path, checkpoint_every=10**9).model_at(t)
        assert msgspec.to_builtins(source.model_at(t).snapshot(t)) == msgspec.to_builtins(full.snapshot(t))
    model, end = load_model(path)
    assert end == source.end_time and model.ranks[2].state is not None
    first = source.first_finding_time()
    assert first is None or crash_t <= first <= source.end_time


def test_truncated_recording_loads_up_to_the_damage(tmp_path: Path) -> None:
    path = tmp_path / "r.ddptop"
    _recording(path, close=False)
    data = path.read_bytes()
    manifest_end = len(gzip.compress(b"x"))  # header+manifest member is tiny; cut well past it
    counts = []
    for cut in range(manifest_end + 400, len(data), max(1, len(data) // 25)):
        cut_path = tmp_path / f"cut{cut}.ddptop"
        cut_path.write_bytes(data[:cut])
        contents = read_file(cut_path)
        assert contents.warnings
        counts.append(len(contents.events))
    assert counts == sorted(counts) and counts[-1] > 0
    whole = read_file(path)
    assert any("end marker" in w for w in whole.warnings)  # flushed but never closed


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _hostile_files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.ddptop"
    _recording(good)
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    man = _manifest()
    state_entry = recording_events(1, 1)[0]
    head, cut = header_bytes(), CrashFile(rank=0, name="../../etc/passwd", text="x")
    one = Sample(time=1.0, step=0, epoch=0, batch=0, seq=0, step_time_s=None, data_wait_fraction=None,
                 loader_ready_batches=None, cpu_percent=None, rss_bytes=None, gpu_util_percent=None)
    many = [one] * (fmt.MAX_SAMPLES_PER_FRAME + 1)
    nan_entry = msgspec.structs.replace(state_entry, time=float("nan"))
    return {
        "empty": _write(tmp_path, "empty", b""),
        "header-cut": _write(tmp_path, "hcut", head[:5]),
        "gzip-header-cut": _write(tmp_path, "gcut", data[:30]),
        "bit-flip": _write(tmp_path, "flip", bytes(flipped)),
        "wrong-magic": _write(tmp_path, "magic", b"PK\x03\x04" + data[4:]),
        "wrong-version": _write(tmp_path, "ver", _raw([man], version=99)),
        "wrong-schema": _write(tmp_path, "schema", _raw([msgspec.structs.replace(man, schema_version=42)])),
        "no-manifest": _write(tmp_path, "noman", _raw([state_entry])),
        "oversized-frame": _write(tmp_path, "big", head + struct.pack(">I", 0xFFFFFFF0) + b"x" * 64),
        "garbage-frame": _write(tmp_path, "garb", head + struct.pack(">I", 4) + b"\xc1\xc1\xc1\xc1"),
        "path-trick": _write(tmp_path, "path", _raw([man, cut])),
        "huge-world": _write(tmp_path, "world", _raw([msgspec.structs.replace(man, world_size=10**9)])),
        "huge-rank": _write(tmp_path, "rank", _raw([man, RecordEntry(
            time=1.0, rank=10**9, message=HistoryMsg(rank=10**9, samples=[]))])),
        "nan-time": _write(tmp_path, "nan", _raw([man, nan_entry])),
        "huge-history": _write(tmp_path, "hist", _raw([man, RecordEntry(
            time=1.0, rank=0, message=HistoryMsg(rank=0, samples=many))])),
        "directory": tmp_path,
        "missing": tmp_path / "does-not-exist",
    }


def test_hostile_files_raise_bundle_error(tmp_path: Path) -> None:
    for name, path in _hostile_files(tmp_path).items():
        with pytest.raises(BundleError) as info:
            ReplaySource(path)
        assert "\n" not in str(info.value), name


def test_hostile_files_refused_by_the_cli(tmp_path: Path) -> None:
    for name, path in _hostile_files(tmp_path).items():
        verbs = [["replay", "--info"], ["replay"]] + ([["doctor"]] if path.is_file() else [])
        for verb in verbs:
            res = subprocess.run(ddptop_cmd(*verb, str(path)), capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL)
            assert res.returncode != 0, (name, res.stdout)
            assert "Traceback" not in res.stderr, (name, res.stderr)
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("ddptop: "), (name, res.stderr)


def test_canary_secrets_never_written(tmp_path: Path) -> None:
    env = {**BASE_ENV, **CANARIES, "NCCL_DEBUG_SUBSYS": "https://user:canarypass777@host/x"}
    path = tmp_path / "b.ddptop"
    writer = BundleWriter(path, _manifest("bundle"), atomic=True)
    for event in recording_events(2, 3, env=env) + bundle_events(2, 10, env=env):
        writer.write(event)
    writer.close()
    raw = path.read_bytes()
    plain = gzip.decompress(raw)
    for value in [*CANARIES.values(), "canarypass777"]:
        assert value.encode() not in raw and value.encode() not in plain, value
    contents = read_file(path)
    state = next(e.message.state for e in contents.events if hasattr(e, "message")
                 and hasattr(e.message, "state"))
    assert state.env["HF_TOKEN"] == "***" and state.env["NCCL_DEBUG"] == "WARN"


def test_atomic_bundle_is_whole_or_absent(tmp_path: Path) -> None:
    path = tmp_path / "b.ddptop"
    writer = BundleWriter(path, _manifest("bundle"), atomic=True)
    writer.write(bundle_events(1, 5)[0])
    assert not path.exists()
    writer.abort()
    assert not path.exists() and not list(tmp_path.iterdir())


def _tiny_frames_file(path: Path, frames: int) -> Path:
    """A crafted recording: a manifest, then *frames* identical tiny valid frames, gzipped."""
    from ddptop.protocol import ConnectionEvent

    one = fmt.encoder.encode(ConnectionEvent(time=1.0, rank=0, status="lost"))
    body = _raw([_manifest()]) + (LENGTH.pack(len(one)) + one) * frames
    path.write_bytes(gzip.compress(body, 9))
    return path


def test_million_tiny_frames_refused_in_proportion_to_file_size(tmp_path: Path) -> None:
    """A ~200 KB file of a million tiny frames is refused with one line, before it is read."""
    path = _tiny_frames_file(tmp_path / "crafted.ddptop", 1_000_000)
    assert path.stat().st_size < 400_000
    with pytest.raises(BundleError, match=r"more than .* frames for its") as info:
        read_file(path)
    assert "\n" not in str(info.value)
    # The same kind of frames, as many as such a file may hold, still read.
    small = _tiny_frames_file(tmp_path / "ok.ddptop", 10_000)
    assert len(read_file(small).events) == 10_000


def test_decompression_bomb_refused_in_proportion_to_file_size(tmp_path: Path) -> None:
    """Valid frames of repeated text expand a thousandfold: refused by the expansion budget."""
    from ddptop.protocol import FrTraceMsg

    path = tmp_path / "bomb.ddptop"
    big = RecordEntry(time=1.0, rank=0, message=FrTraceMsg(rank=0, time=1.0, json="0" * (15 << 20)))
    path.write_bytes(gzip.compress(_raw([_manifest()] + [big] * 8), 6))
    assert path.stat().st_size < 1_000_000
    with pytest.raises(BundleError, match="expands beyond"):
        read_file(path)


def test_protocol_length_caps_refuse_amplifying_lists() -> None:
    """A frame of one-byte list items (floats, empty lists) is refused, not inflated."""
    from ddptop.errors import ProtocolError
    from ddptop.wire import FrameBuffer

    for field_value in ({"load_avg": [0] * 17}, {"loader_worker_pids": [0] * 5000},
                        {"collectives": [{"pg": "0", "seq": 0, "pending": [
                            {"seq": 0, "op": "x", "sizes": [[[]] * 5000]}]}]}):
        state = {"rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "pid": 1, **field_value}
        payload = msgspec.msgpack.encode({"type": "state", "state": state})
        with pytest.raises(ProtocolError, match="length <="):
            FrameBuffer().feed(header_bytes() + LENGTH.pack(len(payload)) + payload)
