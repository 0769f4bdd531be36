"""Coverage-guided fuzzing (atheris / libFuzzer) of everything that decodes foreign bytes.

Targets:

* ``frame``: the wire frame decoder (``FrameBuffer``) fed the input in fuzzer-chosen chunks;
* ``protocol``: one payload decoded as a wire ``Message`` (every protocol struct);
* ``server``: a real ``ReporterServer`` (with and without a token) serving the input as a
  peer's bytes over a socketpair: handshake, auth and request dispatch;
* ``bundle``: ``read_file`` on the input as a file (raw, gzipped, or after a valid
  header and manifest).

Every input must end in a clean result or ddptop's own error (ProtocolError,
BundleError); anything else escapes, and libFuzzer records a crash and stops. Each
target runs in its own process (libFuzzer exits when done) with ``-rss_limit_mb`` set,
so a memory blow-up is a crash too. Prints a table: inputs, crashes, seconds, the
child's baseline and peak RSS.

    .venv/bin/python bench/fuzz.py --runs 1000000          # all targets
    .venv/bin/python bench/fuzz.py --runs 20000 --target frame
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGETS = ("frame", "protocol", "server", "bundle")
RSS_LIMIT_MB = 1024


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- child: one target


def _child(target: str, runs: int, corpus: Path, max_len: int) -> None:
    import atheris

    with atheris.instrument_imports(include=["ddptop"]):
        from ddptop.bundle import format as fmt
        from ddptop.bundle.reader import read_file
        from ddptop.errors import BundleError, ProtocolError
        from ddptop.net.server import ReporterServer
        from ddptop.protocol import Message, RankState, Request, StateMsg
        from ddptop.wire import LENGTH, FrameBuffer, header_bytes

    manifest_stream = header_bytes() + _frame(fmt.encoder.encode(fmt.Manifest(
        schema_version=fmt.SCHEMA_VERSION, kind="recording", created=1.0, job_id="j", world_size=2,
        ddptop_version="0")), LENGTH)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    scratch = Path(tempfile.mkdtemp(prefix="ddptop-fuzz-", dir=shm))
    state = StateMsg(state=RankState(rank=0, local_rank=0, world_size=2, host="h", pid=1))

    def handler(request: Request) -> Message:
        return StateMsg(state=state.state, id=request.id)

    servers = [ReporterServer("127.0.0.1", 0, None, 0, "fuzz", handler),
               ReporterServer("127.0.0.1", 0, "fuzz-token", 0, "fuzz", handler)]

    def frame(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        cuts = [fdp.ConsumeIntInRange(0, 64) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        rest = fdp.ConsumeBytes(fdp.remaining_bytes())
        body = header_bytes() + rest if cuts and cuts[0] % 2 else rest
        buf = FrameBuffer()
        try:
            pos = 0
            for cut in [*cuts, len(body)]:
                buf.feed(body[pos : pos + cut] if cut != len(body) else body[pos:])
                pos += cut
        except ProtocolError:
            pass

    def protocol(data: bytes) -> None:
        try:
            FrameBuffer(expect_header=False).feed(LENGTH.pack(len(data)) + data)
        except ProtocolError:
            pass

    def server(data: bytes) -> None:
        import socket

        srv = servers[data[0] & 1] if data else servers[0]
        ours, peer = socket.socketpair()
        srv.adopt(ours, "fuzz")
        try:
            peer.sendall(header_bytes() + data[1:] if data[:1] and data[0] & 2 else data[1:])
        except OSError:
            pass
        srv.poll(0)
        srv.poll(0)
        peer.close()
        srv.poll(0)

    def bundle(data: bytes) -> None:
        mode = data[0] % 3 if data else 0
        body = data[1:]
        content = body if mode == 0 else gzip.compress(body, 1) if mode == 1 else gzip.compress(
            manifest_stream + body, 1)
        path = scratch / "f.ddptop"
        path.write_bytes(content)
        try:
            read_file(path)
        except BundleError:
            pass

    one = {"frame": frame, "protocol": protocol, "server": server, "bundle": bundle}[target]
    print(f"BASELINE_RSS_KIB {_rss_kib()}", file=sys.stderr, flush=True)
    argv = [sys.argv[0], f"-runs={runs}", f"-max_len={max_len}", f"-rss_limit_mb={RSS_LIMIT_MB}",
            "-print_final_stats=1", f"-artifact_prefix={corpus.parent}/crash-{target}-", str(corpus)]
    atheris.Setup(argv, one)
    atheris.Fuzz()


def _frame(payload: bytes, length: object) -> bytes:
    return length.pack(len(payload)) + payload  # type: ignore[attr-defined, no-any-return]


def _seed_corpus(target: str, where: Path) -> None:
    """Valid inputs to start from: libFuzzer mutates its way out from real messages."""
    from ddptop.protocol import AuthProof, ConnectionEvent, RankState, Request, StateMsg
    from ddptop.wire import encode_frame, header_bytes

    msgs = [Request(command="state", id=1), Request(command="subscribe"), AuthProof(mac="00" * 32),
            StateMsg(state=RankState(rank=0, local_rank=0, world_size=2, host="h", pid=1, load_avg=[1.0])),
            ConnectionEvent(time=1.0, rank=0, status="lost")]
    where.mkdir(parents=True, exist_ok=True)
    for i, m in enumerate(msgs):
        frame = encode_frame(m)
        seed = {"frame": b"\x01\x05" + header_bytes() + frame, "protocol": frame[4:],
                "server": b"\x02" + frame, "bundle": b"\x02" + frame}[target]
        (where / f"seed{i}").write_bytes(seed)


# ---------------------------------------------------------------- parent: the table


def _run_target(target: str, runs: int, max_len: int, work: Path) -> dict[str, object]:
    corpus = work / target / "corpus"
    _seed_corpus(target, corpus)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--child", target, "--runs", str(runs),
                             "--max-len", str(max_len), "--corpus", str(corpus)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    seconds = time.monotonic() - t0
    done = re.findall(r"Done (\d+) runs", err)
    execs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", err)
    inputs = int(done[-1]) if done else int(execs[-1]) if execs else 0
    base = re.findall(r"BASELINE_RSS_KIB (\d+)", err)
    peak = re.findall(r"stat::peak_rss_mb:\s*(\d+)", err)
    crashed = proc.returncode != 0
    log = work / f"{target}.log"
    log.write_text(err)
    return {"target": target, "inputs": inputs, "crashes": int(crashed), "seconds": seconds,
            "base_mb": int(base[0]) / 1024 if base else float("nan"),
            "peak_mb": int(peak[-1]) if peak else float("nan"), "log": str(log)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100_000, help="inputs per target (default 100000)")
    ap.add_argument("--target", choices=TARGETS, action="append", help="only these targets")
    ap.add_argument("--max-len", type=int, default=4096, help="largest input in bytes")
    ap.add_argument("--child", choices=TARGETS, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.runs, args.corpus, args.max_len)
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("bench/fuzz.py needs atheris: .venv/bin/python -m pip install -e '.[fuzz]'", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ddptop-fuzzrun-"))
    print(f"fuzz: {args.runs} inputs per target, max {args.max_len} bytes, rss limit {RSS_LIMIT_MB} MB, "
          f"logs in {work}")
    print(f"{'target':10} {'inputs':>10} {'crashes':>8} {'seconds':>8} {'base RSS MB':>12} "
          f"{'peak RSS MB':>12}")
    rows = []
    for target in args.target or TARGETS:
        row = _run_target(target, args.runs, args.max_len, work)
        rows.append(row)
        print(f"{row['target']:10} {row['inputs']:>10} {row['crashes']:>8} {row['seconds']:>8.0f} "
              f"{row['base_mb']:>12.0f} {row['peak_mb']:>12}", flush=True)
        if row["crashes"]:
            print(f"  crash: see {row['log']}", flush=True)
    return 1 if any(r["crashes"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
