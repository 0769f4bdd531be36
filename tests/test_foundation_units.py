"""Unit tests of the foundation shared by ranks and viewers: wire, auth, secrets, discovery."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop import auth, secrets_filter, wire
from ddptop.errors import AuthError, ProtocolError
from ddptop.protocol import Hello, Message, RankState, Request, StateMsg
from ddptop.store import discovery


def _messages() -> list[Message]:
    return [
        Hello(protocol=1, role="rank", rank=3, job_id="j"),
        Request(command="state", id=1),
        StateMsg(state=RankState(rank=3, local_rank=3, world_size=4, host="h", pid=9, step=42,
                                 env={"NCCL_DEBUG": "INFO"})),
    ]


def _stream(messages: list[Message]) -> bytes:
    return wire.header_bytes() + b"".join(wire.encode_frame(m) for m in messages)


# ---------------------------------------------------------------- wire


def test_framebuffer_split_at_every_byte_boundary() -> None:
    """Two reads cut anywhere decode to exactly the same messages."""
    msgs = _messages()
    data = _stream(msgs)
    for cut in range(len(data) + 1):
        buf = wire.FrameBuffer()
        got = buf.feed(data[:cut]) + buf.feed(data[cut:])
        assert got == msgs, f"cut at byte {cut}"
        assert buf.pending_bytes == 0


def test_framebuffer_one_byte_at_a_time() -> None:
    """The worst socket: every recv returns one byte."""
    msgs = _messages()
    buf = wire.FrameBuffer()
    got: list[Message] = []
    for i, byte in enumerate(_stream(msgs)):
        got += buf.feed(bytes([byte]))
        assert len(got) <= len(msgs), i
    assert got == msgs


@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\n", b"X", b"\x00\x00\x00\x10"])
def test_framebuffer_refuses_garbage_at_first_bytes(data: bytes) -> None:
    """A foreign peer is refused as soon as its bytes disagree with the magic."""
    with pytest.raises(ProtocolError, match="not a ddptop stream"):
        wire.FrameBuffer().feed(data)


def test_framebuffer_refuses_wrong_version_and_oversized_length() -> None:
    """Version mismatch and over-limit lengths raise before any payload is read."""
    with pytest.raises(ProtocolError, match="version 7"):
        wire.FrameBuffer().feed(wire.header_bytes(version=7))
    buf = wire.FrameBuffer(limit=100)
    with pytest.raises(ProtocolError, match="exceeds"):
        buf.feed(wire.header_bytes() + wire.LENGTH.pack(101))
    with pytest.raises(ProtocolError, match="undecodable"):
        wire.FrameBuffer().feed(wire.header_bytes() + wire.LENGTH.pack(2) + b"\xc1\xc1")


def test_framebuffer_round_trip_in_any_chunking() -> None:
    """Bytes fed one at a time or all at once decode to the same messages, nothing left over."""
    msgs = _messages()
    data = _stream(msgs)
    buf, got = wire.FrameBuffer(), []
    for i in range(len(data)):
        got.extend(buf.feed(data[i : i + 1]))
    assert got == msgs and buf.pending_bytes == 0
    assert wire.FrameBuffer().feed(data) == msgs


@pytest.mark.parametrize("cut_back", [1, 3, 5, 20])
def test_framebuffer_cut_inside_a_frame_keeps_complete_frames(cut_back: int) -> None:
    """A stream cut inside the last frame yields every complete frame and holds the rest."""
    msgs = _messages()
    buf = wire.FrameBuffer()
    assert buf.feed(_stream(msgs)[:-cut_back]) == msgs[:-1]
    assert buf.pending_bytes > 0 and buf.decoded == len(msgs) - 1


def test_encode_frame_refuses_oversized_payload() -> None:
    """The sender enforces the same limit as the receiver."""
    huge = StateMsg(state=RankState(rank=0, local_rank=0, world_size=1, host="h", pid=1,
                                    env={"X": "y" * (wire.MAX_FRAME_BYTES + 1)}))
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.encode_frame(huge)


# ---------------------------------------------------------------- auth


def test_prove_and_verify() -> None:
    """Only the right token for the right nonce verifies; nonces are fresh."""
    nonce = auth.new_nonce()
    assert len(nonce) == 32 and nonce != auth.new_nonce()
    mac = auth.prove("tok", nonce)
    assert auth.verify("tok", nonce, mac)
    assert not auth.verify("tok2", nonce, mac)
    assert not auth.verify("tok", auth.new_nonce(), mac)
    assert not auth.verify("tok", nonce, "")
    assert "tok" not in mac


def test_load_token_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Explicit beats env beats file; a file must be private and non-empty."""
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    monkeypatch.delenv(auth.TOKEN_FILE_ENV, raising=False)
    assert auth.load_token() is None
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    token_file.chmod(0o600)
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, str(token_file))
    assert auth.load_token() == "from-file"
    monkeypatch.setenv(auth.TOKEN_ENV, "from-env")
    assert auth.load_token() == "from-env"
    assert auth.load_token("explicit") == "explicit"
    monkeypatch.delenv(auth.TOKEN_ENV)
    token_file.chmod(0o644)
    with pytest.raises(AuthError, match="chmod 600"):
        auth.load_token()
    token_file.chmod(0o600)
    token_file.write_text("  \n")
    with pytest.raises(AuthError, match="empty"):
        auth.load_token()
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(AuthError, match="cannot read"):
        auth.load_token()


# ---------------------------------------------------------------- secrets


CANARIES = {
    "HF_TOKEN": "hf_CanaryCanaryCanary1234567890",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "DDPTOP_TOKEN": "ddptop-canary-token",
    "NCCL_SOCKET_IFNAME": "eth0",
    "TORCH_HOME_URL": "https://alice:CanaryPassw0rd@example.com/models",
    "NCCL_EXTRA": "x ghp_CanaryGithubToken1234567890 y",
    "OMP_NUM_THREADS": "4",
    "MASTER_ADDR": "10.0.0.1",
    "HOME": "/home/canary",
    "AWS_SECRET_ACCESS_KEY": "CanaryAWSSecretKey",
}


def test_canary_secrets_never_leave() -> None:
    """Every canary value is masked or dropped; useful variables survive unchanged."""
    out = secrets_filter.filter_env(dict(CANARIES))
    text = repr(out)
    for needle in ("CanaryCanary", "0123456789abcdef", "ddptop-canary-token", "CanaryPassw0rd",
                   "CanaryGithubToken", "CanaryAWSSecretKey"):
        assert needle not in text, needle
    assert out["HF_TOKEN"] == secrets_filter.MASK and out["DDPTOP_TOKEN"] == secrets_filter.MASK
    assert out["WANDB_API_KEY"] == secrets_filter.MASK
    assert out["TORCH_HOME_URL"] == "https://alice:***@example.com/models"
    assert out["NCCL_EXTRA"] == "x *** y"
    assert out["NCCL_SOCKET_IFNAME"] == "eth0" and out["OMP_NUM_THREADS"] == "4"
    assert out["MASTER_ADDR"] == "10.0.0.1"
    assert "HOME" not in out and "AWS_SECRET_ACCESS_KEY" not in out  # not a reported prefix


def test_secret_names() -> None:
    """Names decide, whatever the value looks like."""
    assert secrets_filter.is_secret_name("my_api_key")
    assert secrets_filter.is_secret_name("NCCL_AUTH_THING")
    assert not secrets_filter.is_secret_name("NCCL_DEBUG")


def test_free_text_is_masked_like_the_environment() -> None:
    """Exception texts and FR dumps go through the same filter: secrets after secret names."""
    mask = secrets_filter.mask_value
    assert mask("ValueError: bad config password=hunter2 (x.py:3)") == \
        "ValueError: bad config password=*** (x.py:3)"
    assert mask("--api-key=ZZZ --lr 0.1") == "--api-key=*** --lr 0.1"
    assert mask("secret_key = 'q1'") == "secret_key = '***'"
    # Words of the trade that merely contain a secret word stay readable.
    for plain in ("tokenizer=bert-base", "max_tokens=5", "KeyError: 'lr'", "NCCL_SOCKET_IFNAME=eth0"):
        assert mask(plain) == plain
    # A Flight Recorder dump stays valid JSON with its secret-named fields masked.
    fr = json.dumps({"pg_config": {"0": {"desc": "default_pg", "auth_token": "Canary42"}},
                     "entries": [{"profiling_name": "gloo:all_reduce", "frames": [{"name": "step"}]}]})
    out = json.loads(mask(fr))
    assert out["pg_config"]["0"]["auth_token"] == "***"
    assert out["entries"][0]["profiling_name"] == "gloo:all_reduce"
    # Linear in hostile text: long runs of name characters (the suite's timeout bounds it).
    for hostile in ("a." * 300_000, "token_" * 100_000, "password" * 100_000):
        assert len(mask(hostile)) <= len(hostile)


# ---------------------------------------------------------------- discovery


def test_runtime_dir_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Created 0700, and tightened to 0700 when it already exists wider."""
    target = tmp_path / "rt"
    monkeypatch.setenv(discovery.RUNTIME_ENV, str(target))
    old = os.umask(0o022)
    try:
        path = discovery.runtime_dir()
    finally:
        os.umask(old)
    assert path == target and stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)
    discovery.runtime_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert discovery.runtime_dir(create=False) == target


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid  # reaped: no process has this pid (until the kernel reuses it)


def test_records_stale_pids_and_junk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live records are listed, stale ones only on request, junk never."""
    monkeypatch.setenv(discovery.RUNTIME_ENV, str(tmp_path / "rt"))
    live = discovery.Endpoint(job_id="j1", rank=1, world_size=2, host="127.0.0.1", port=1234,
                              pid=os.getpid(), node="n")
    dead = discovery.Endpoint(job_id="j1", rank=0, world_size=2, host="127.0.0.1", port=1235,
                              pid=_dead_pid())
    path = discovery.write_entry(live)
    discovery.write_entry(dead)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    (path.parent / "junk.0.json").write_text("{not json")
    (path.parent / "list.0.json").write_text("[1, 2]")
    assert discovery.read_entries() == [live]
    assert sorted(discovery.read_entries(include_stale=True), key=lambda e: e.rank) == [dead, live]
    assert discovery.jobs_on_host() == {"j1": [live]}
    assert Path(discovery.rank_file("j1", 0, "crash")).name == "j1.0.crash"
    assert discovery.Endpoint.from_json(live.to_json()) == live
    assert not list(path.parent.glob("*.tmp*"))  # atomic write left no temporary behind


def test_pid_alive() -> None:
    """This process is alive; a reaped child is not."""
    assert discovery.pid_alive(os.getpid())
    assert not discovery.pid_alive(_dead_pid())


# ---------------------------------------------------------------- collectives (FR parsing)


def _fr_dump(entries: list[dict[str, object]], last_completed: int) -> str:
    import json

    # The shape gloo produces on torch 2.13: state stays "scheduled", pg_config keyed by "".
    return json.dumps({
        "version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_enqueued_collective": str(max([0] + [int(str(e["collective_seq_id"]))
                                                                        for e in entries])),
                            "last_started_collective": "-1",
                            "last_completed_collective": str(last_completed)}},
        "entries": entries,
    })


def _entry(seq: int, op: str = "gloo:all_gather", retired: bool = False, created: float = 1000.0
           ) -> dict[str, object]:
    return {"collective_seq_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"],
            "profiling_name": op, "state": "scheduled", "retired": retired, "is_p2p": False,
            "time_created_ns": int(created * 1e9), "timeout_ms": 60000,
            "input_sizes": [[4]], "output_sizes": [[2, 4]], "input_dtypes": ["Float"]}


def test_pending_from_gloo_fr_dump() -> None:
    """Retired and completed ops are not pending; the op beyond them is, with its age."""
    from ddptop.reporter.collectives import pending_from_fr

    text = _fr_dump([_entry(1, "gloo:all_reduce", retired=True), _entry(2, "gloo:all_reduce"),
                     _entry(3, created=1000.0)], last_completed=2)
    pending = pending_from_fr(text, now=1012.5)
    assert list(pending) == ["0"]
    (op,) = pending["0"]
    assert (op.seq, op.op, op.dtype, op.timeout_s) == (3, "gloo:all_gather", "Float", 60.0)
    assert op.sizes == [[[4]], [[2, 4]]]
    assert op.age_s == pytest.approx(12.5)
    assert pending_from_fr("", 0.0) == {} and pending_from_fr("not json", 0.0) == {}


class _FakePg:
    def __init__(self) -> None:
        self.seq = 5
        self.group_name = "0"
        self.group_desc = "default_pg"

    def _get_sequence_number_for_group(self) -> int:
        return self.seq

    def size(self) -> int:
        return 2


def test_tracker_reads_fr_only_when_stalled_and_forgets_completed_ops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled group gets FR's pending ops with a growing age; an op that FR later
    shows completed disappears even though seq never moves again (an idle rank)."""
    from types import SimpleNamespace

    from ddptop.reporter import collectives

    pg = _FakePg()
    c10d = SimpleNamespace(_world=SimpleNamespace(pg_map={pg: ("gloo", None)}, pg_names={pg: "0"}))
    dumps = [_fr_dump([_entry(5, created=100.0)], last_completed=4)]
    reads: list[int] = []

    def fake_read(include_collectives: bool = True, backend: str = "") -> str:
        reads.append(1)
        return dumps[-1]  # a full dump also carries the status a status-only read asks for

    monkeypatch.setattr(collectives, "read_fr_json", fake_read)
    tracker = collectives.CollectiveTracker(fr_after_s=2.0)
    assert tracker.groups(c10d, 100.0)[0].pending == []
    assert tracker.groups(c10d, 101.0)[0].pending == [] and reads == []  # not stalled yet
    group = tracker.groups(c10d, 102.5)[0]
    assert [op.seq for op in group.pending] == [5] and group.pending[0].age_s == pytest.approx(2.5)
    assert group.timeout_s == 60.0 and tracker.backend == "gloo"
    assert tracker.groups(c10d, 104.0)[0].pending[0].age_s == pytest.approx(4.0)
    dumps.append(_fr_dump([_entry(5, created=100.0)], last_completed=5))  # it completed
    assert tracker.groups(c10d, 105.0)[0].pending == []
    pg.seq = 6  # seq moves: nothing is pending until it stalls again
    assert tracker.groups(c10d, 106.0)[0].pending == []


def test_read_fr_json_returns_text_not_bytes_repr() -> None:
    """torch returns bytes; the reporter must hand on JSON text."""
    torch = pytest.importorskip("torch")
    from ddptop.reporter import collectives

    if getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None) is None:
        pytest.skip("this torch has no Flight Recorder JSON dump")
    text = collectives.read_fr_json()
    assert isinstance(text, str) and not text.startswith("b'")
    import json

    assert "entries" in json.loads(text) or "version" in json.loads(text)


_TEARDOWN_CHECK = r"""
import inspect, os, socket, sys, time
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
original = dist.destroy_process_group
from ddptop.reporter.config import config_from_env
from ddptop.reporter.progress import install_torch_patches
patched = install_torch_patches(torch, config_from_env().teardown_yield_s)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
began = time.perf_counter()
dist.destroy_process_group()
took = time.perf_counter() - began
print(sorted(patched))
print(dist.destroy_process_group is c10d.destroy_process_group,
      getattr(dist.destroy_process_group, "__wrapped__", None) is original,
      inspect.signature(dist.destroy_process_group) == inspect.signature(original),
      dist.is_initialized(), round(took, 3))
"""


@pytest.mark.parametrize("yield_s", ["0.2", "0"])
def test_destroy_process_group_yields_the_gil_first(yield_s: str) -> None:
    """The torch 2.13 gloo teardown-deadlock guard: a wrapped, signature-preserving
    destroy_process_group that sleeps first (off with DDPTOP_TEARDOWN_YIELD=0)."""
    pytest.importorskip("torch")
    env = dict(os.environ, DDPTOP_TEARDOWN_YIELD=yield_s, DDPTOP_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", _TEARDOWN_CHECK], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    same, wrapped, signature, initialized, took = out[1].split()
    assert same == "True" and initialized == "False"
    if yield_s == "0":
        assert "destroy_process_group(yield)" not in out[0] and wrapped == "False"
    else:
        assert "destroy_process_group(yield)" in out[0] and wrapped == "True" and signature == "True"
        assert float(took) >= 0.2


def test_reporter_server_poll_wakes_at_once() -> None:
    """A rank's exit must not wait out the reporter's poll timeout (one sampling interval)."""
    import threading

    from ddptop.net.server import ReporterServer

    server = ReporterServer("127.0.0.1", 0, None, 0, "j", lambda request: request)  # type: ignore[arg-type,return-value]
    try:
        thread = threading.Thread(target=server.poll, args=(30.0,), daemon=True)
        thread.start()
        server.wake()  # before or during the poll: either way it must end at once
        # The poll would last 30 s: ending within 10 s is the wake-up, by a wide margin.
        thread.join(timeout=10.0)
        assert not thread.is_alive()
    finally:
        server.close()


_FSDP_CHECK = r"""
import sys
import torch
from torch import nn
from ddptop.reporter import progress
progress.install_torch_patches(torch, 0.0)
print("fsdp imported by the patches:", "torch.distributed.fsdp" in sys.modules)
seen = []
progress.PROGRESS.on_wrap = lambda label, module, device_ids: seen.append((label, type(module).__name__))
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
shell = FSDP.__new__(FSDP)          # no process group needed: only the registration matters
nn.Module.__init__(shell)
shell._fsdp_wrapped_module = nn.Linear(2, 2)
holder = nn.Module()
holder.module = nn.Linear(2, 2)     # "module" on a plain Module is not a DDP wrap
print(seen)
"""


def test_wrapper_fingerprint_hook_finds_fsdp_without_importing_it() -> None:
    """FSDP costs ~0.6 s to import: the hook must find it only once the script did."""
    pytest.importorskip("torch")
    env = dict(os.environ, DDPTOP_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", _FSDP_CHECK], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0] == "fsdp imported by the patches: False"
    assert out[1] == "[('FullyShardedDataParallel', 'Linear')]"


@pytest.mark.parametrize("token", ["", "s3cret"])
def test_rank_refuses_a_non_loopback_bind_without_a_token(token: str, tmp_path: Path) -> None:
    """DDPTOP_BIND set by hand (not through `ddptop launch --bind`): the rank itself refuses
    to serve an open port without a token, and the script runs on without a reporter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPTOP_")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", DDPTOP_BIND="0.0.0.0",
               DDPTOP_RUNTIME_DIR=str(tmp_path), DDPTOP_TOKEN=token)
    code = "import ddptop; print(ddptop.install()); print('training ran')"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    if token:
        assert res.stdout.split() == ["True", "training", "ran"], res.stderr
    else:
        assert res.stdout.split() == ["False", "training", "ran"]
        assert res.stderr.strip() == ("ddptop: reporter disabled in this rank: "
                                      "binding to 0.0.0.0 requires a token (set DDPTOP_TOKEN)")


# ---------------------------------------------------------------- multi-node addresses


def test_advertise_address_prefers_what_other_hosts_can_reach() -> None:
    """DDPTOP_ADVERTISE, else a specific bind, else the route to MASTER_ADDR, else the hostname."""
    import socket

    from ddptop.reporter.store_publish import advertise_address

    assert advertise_address("0.0.0.0", "10.9.8.7", "127.0.0.1") == "10.9.8.7"
    assert advertise_address("127.0.0.1", "", "10.0.0.1") == "127.0.0.1"
    assert advertise_address("0.0.0.0", "", "127.0.0.1") == "127.0.0.1"  # the route's local end
    assert advertise_address("::", "", "::1") == "::1"
    # A name would need DNS as the rank starts: the hostname, as before.
    assert advertise_address("0.0.0.0", "", "master.example") == socket.gethostname()
    assert advertise_address("0.0.0.0", "", None) == socket.gethostname()


def test_unreachable_summary_tells_refusal_from_silence_and_names_a_lost_host() -> None:
    from ddptop.client.collect import unreachable_summary

    hosts = {0: "a", 1: "a", 2: "b at 192.0.2.2", 3: "b at 192.0.2.2"}
    refused = {r: f"rank {r} at x:1 requires a token (set DDPTOP_TOKEN)" for r in (0, 1)}
    silent = {r: f"rank {r} at 192.0.2.2:1: timed out" for r in (2, 3)}
    line = unreachable_summary({**refused, **silent}, hosts)
    assert line.startswith("2 rank(s) refused us, wrong or missing token"), line
    assert "2 rank(s) did not answer: 2-3" in line
    assert "none of host b at 192.0.2.2's ranks (2-3) answered" in line
    # One rank of a host silent: not a lost host; one host only: nothing to compare.
    assert "none of host" not in unreachable_summary({2: "timed out"}, hosts)
    assert "none of host" not in unreachable_summary({0: "x", 1: "y"}, {0: "a", 1: "a"})
