"""Shared set-up for the probes: backend choice, a tiny model, a bounded run time.

The helpers live in the package (``ddptop/_demo/train_common.py``) because ``ddptop demo``
ships its job there; the probes import them from here, as they always did.
"""

from __future__ import annotations

from ddptop._demo.train_common import (
    deadline,
    hold_until_released,
    setup,
    small_model,
    step_sleep,
    stop_together,
    train_step,
    wrap_ddp,
)

__all__ = ["deadline", "hold_until_released", "setup", "small_model", "step_sleep", "stop_together",
           "train_step", "wrap_ddp"]
