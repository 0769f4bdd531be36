"""What the verbs that read evidence share: its warnings, printed on stderr one line each.

Which words are paths and which name a job is :mod:`ddptop.api.targets`' to tell.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def warn(warnings: Iterable[str], limit: int = 20) -> None:
    """Print evidence warnings on stderr, one line each, at most *limit* of them."""
    shown = list(warnings)
    for line in shown[:limit]:
        print(f"ddptop: warning: {line}", file=sys.stderr)
    if len(shown) > limit:
        print(f"ddptop: warning: ... and {len(shown) - limit} more", file=sys.stderr)
