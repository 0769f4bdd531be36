"""``ddptop attach [TARGET]``: the live dashboard of a running job."""

from __future__ import annotations

import argparse

from ddptop import auth
from ddptop.client.live import DIGEST_FROM_RANKS, LiveSource
from ddptop.client.targets import resolve


def configure(parser: argparse.ArgumentParser) -> None:
    """Add attach's options."""
    parser.add_argument("target", nargs="?",
                        help="job id or MASTER_ADDR:MASTER_PORT (default: the only job here)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="connect / TCPStore timeout in seconds")


def run(args: argparse.Namespace) -> int:
    """Resolve the target and run the dashboard until the user quits."""
    from ddptop.tui.app import DdptopApp  # textual only when a dashboard is wanted

    target = resolve(args.target, store_timeout_s=args.timeout)
    # A big job's node agents send digests (what changed, once per interval) to the dashboard.
    source = LiveSource(target, token=auth.load_token(), connect_timeout=args.timeout,
                        digest=target.world_size >= DIGEST_FROM_RANKS)
    DdptopApp(source).run()
    return 0
