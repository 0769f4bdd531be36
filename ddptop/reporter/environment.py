"""Versions, reported environment, and fingerprints of parameters and RNG states.

Fingerprints are short hashes: ranks are compared by equality, and no parameter value
or random state ever leaves the rank.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import Any

from ddptop import __version__
from ddptop.protocol import ParamFingerprint, RngFingerprint, Versions
from ddptop.secrets_filter import filter_env

MAX_SHAPES = 4096  # parameters listed by name in a fingerprint (hash covers them all)


def versions(driver: str | None = None) -> Versions:
    """Python, torch, CUDA and NCCL versions of this rank (None where absent)."""
    out = Versions(python=platform.python_version(), ddptop=__version__, driver=driver)
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    out.torch = str(torch.__version__)
    out.cuda = getattr(torch.version, "cuda", None)
    try:
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            out.nccl = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:
        out.nccl = None
    return out


def reported_env() -> dict[str, str]:
    """NCCL_*, TORCH_*, CUDA_*, OMP_* (and kin) with secrets masked."""
    return filter_env(dict(os.environ))


def param_fingerprint(wrapper: str, module: Any) -> ParamFingerprint:
    """Count, element total and shape hash of *module*'s parameters (no values)."""
    digest = hashlib.blake2b(digest_size=8)
    shapes: list[tuple[str, list[int]]] = []
    count = numel = 0
    for name, param in module.named_parameters():
        shape = [int(d) for d in param.shape]
        digest.update(f"{name}:{shape};".encode())
        count += 1
        numel += int(param.numel())
        if len(shapes) < MAX_SHAPES:
            shapes.append((name, shape))
    return ParamFingerprint(count=count, numel=numel, shapes_hash=digest.hexdigest(),
                            wrapper=wrapper, shapes=shapes)


def _hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


def rng_fingerprint(epoch: int) -> RngFingerprint:
    """Hashes of the torch, numpy and ``random`` generator states right now."""
    fp = RngFingerprint(epoch=epoch)
    torch = sys.modules.get("torch")
    if torch is not None:
        fp.torch = _hash(bytes(torch.get_rng_state().numpy().tobytes()))
    np = sys.modules.get("numpy")
    if np is not None:
        state = np.random.get_state()
        fp.numpy = _hash(state[1].tobytes() + str(state[2:]).encode())
    import random

    fp.python = _hash(repr(random.getstate()).encode())
    return fp
