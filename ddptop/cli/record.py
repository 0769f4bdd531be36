"""``ddptop record -o FILE [TARGET]``: a headless recorder, crash-safe, until the job ends.

Attaches like the dashboard (one live source) and writes every event it receives. The
file is flushed at least every second, so killing the recorder loses at most the last
second. It stops when every rank is lost, exited or crashed, or on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

from ddptop import auth
from ddptop._version import __version__
from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.writer import BundleWriter
from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import resolve
from ddptop.status import ENDED


def configure(parser: argparse.ArgumentParser) -> None:
    """Add record's options."""
    parser.add_argument("target", nargs="?",
                        help="job id or MASTER_ADDR:MASTER_PORT (default: the only job here)")
    parser.add_argument("-o", "--output", required=True, help="file to write (a ddptop recording)")
    parser.add_argument("--timeout", type=float, default=5.0, help="connect / store timeout in seconds")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop after this long (0: until the job ends)")


def run(args: argparse.Namespace) -> int:
    """Record until the job ends or we are told to stop; print a one-line summary."""
    target = resolve(args.target, store_timeout_s=args.timeout)
    hosts = sorted({e.node or e.host for e in target.endpoints + target.dead})
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=time.time(),
                        job_id=target.job_id, world_size=target.world_size,
                        ddptop_version=__version__, hosts=hosts)
    writer = BundleWriter(args.output, manifest)
    feed = ModelFeed(target.job_id, target.world_size, tee=writer.write)
    stop = threading.Event()
    reason = ["job ended"]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        reason[0] = signal.Signals(signum).name
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    source = LiveSource(target, token=auth.load_token(), connect_timeout=args.timeout)
    began = time.monotonic()
    source.start(feed.emit)
    try:
        while not stop.wait(0.25):
            writer.flush_if_due()
            statuses = feed.statuses(time.time())
            if len(statuses) >= target.world_size and all(s in ENDED for s in statuses.values()):
                break
            if args.max_seconds and time.monotonic() - began >= args.max_seconds:
                reason[0] = "time limit"
                break
    except KeyboardInterrupt:
        reason[0] = "interrupted"
    finally:
        source.stop()
        writer.close(reason[0])
        signal.signal(signal.SIGTERM, previous)
    statuses = feed.statuses(time.time())
    ended = sum(1 for s in statuses.values() if s in ENDED)
    print(f"recorded job {target.job_id}: {writer.frames} frames, {ended}/{target.world_size} ranks ended, "
          f"{time.monotonic() - began:.0f} s, {writer.bytes_written / 1024:.0f} KiB -> {args.output} "
          f"({reason[0]})", file=sys.stderr)
    return 0
