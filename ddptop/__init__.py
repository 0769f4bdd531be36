"""ddptop: `top` for torchrun jobs.

Inside a training rank, ``import ddptop; ddptop.install()`` starts the reporter (or run
the job under ``ddptop launch`` and change nothing). ``ddptop.step()`` counts a step
for loops without an optimizer. This module imports nothing heavy: it is loaded into
every rank.
"""

from __future__ import annotations

from ddptop._version import __version__

__all__ = ["__version__", "install", "step"]


def install() -> bool:
    """Start this rank's reporter (idempotent); False if it is off or not a rank."""
    from ddptop.reporter import install as _install

    return _install()


def step() -> None:
    """Count one training step (for loops that do not call ``optimizer.step()``)."""
    from ddptop.reporter.progress import PROGRESS

    PROGRESS.mark_step()
