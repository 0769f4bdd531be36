"""DeepSpeed's engine, seen from inside the rank without importing deepspeed.

The parameter fingerprint of a DDP model is taken when DDP registers the user's module,
before DDP checks shapes across ranks. ``DeepSpeedEngine`` registers the model by writing
``_modules`` directly (``_set_client_model``: no module-registration hook fires), then
broadcasts the parameters from rank 0 (a rank whose model differs fails or hangs there).
So the same moment is caught by wrapping ``_set_client_model`` at class level, once the job
itself has imported ``deepspeed.runtime.engine`` (:func:`ddptop.reporter.torch_import.when_imported`;
ddptop never imports deepspeed: it costs seconds per rank). When the engine's ``__init__``
returns, the fingerprint is taken again: ZeRO-3 has partitioned the parameters by then, and
the fingerprint says how much of them this rank holds (see ``environment.param_fingerprint``).

Both wrappers run once per engine, never per step, and never raise into the job: a failure is
counted in the reporter's errors. A DeepSpeed without ``_set_client_model`` (another version)
still gets the fingerprint when ``__init__`` returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from ddptop.protocol import ParamFingerprint
from ddptop.reporter import environment

ENGINE_MODULE = "deepspeed.runtime.engine"
WRAPPER = "DeepSpeedEngine"


class WrapListener(Protocol):
    """What the engine's wrappers tell (:class:`ddptop.reporter.progress.Progress`)."""

    on_wrap: Callable[[str, Any, Any], None] | None
    hook_errors: int


def patch_engine(module: ModuleType, progress: WrapListener) -> None:
    """Wrap ``DeepSpeedEngine._set_client_model`` and ``__init__`` of the imported *module*."""
    cls = getattr(module, WRAPPER, None)
    if cls is None or getattr(cls, "_ddptop_patched", False):
        return

    def tell(engine: Any) -> None:
        if progress.on_wrap is not None:
            try:
                progress.on_wrap(WRAPPER, engine, None)
            except Exception:
                progress.hook_errors += 1

    set_client = getattr(cls, "_set_client_model", None)
    if set_client is not None:

        @functools.wraps(set_client)
        def _set_client_model(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = set_client(self, *args, **kwargs)
            tell(self)  # before the engine broadcasts the parameters across ranks
            return out

        cls._set_client_model = _set_client_model
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        tell(self)  # ZeRO-3 has partitioned the parameters by now

    cls.__init__ = __init__
    cls._ddptop_patched = True


def fingerprint(engine: Any) -> ParamFingerprint:
    """The fingerprint of the model *engine* holds, with its ZeRO stage."""
    # The engine passes unknown attributes through to the model (__getattr__): read its own.
    model = engine.__dict__.get("module") or engine._modules.get("module")
    if model is None:
        raise ValueError("DeepSpeedEngine without a module")
    return environment.param_fingerprint(WRAPPER, model, zero_stage=zero_stage(engine))


def zero_stage(engine: Any) -> int | None:
    """The engine's ZeRO stage (0 without ZeRO), None where its config cannot tell."""
    try:
        stage = engine.zero_optimization_stage()
    except Exception:
        return None
    return int(stage) if isinstance(stage, int) and not isinstance(stage, bool) else None
