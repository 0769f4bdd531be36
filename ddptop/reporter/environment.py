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

from ddptop._version import __version__
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
    out.nccl = nccl_version(torch)
    return out


def cuda_initialised(torch: Any) -> bool:
    """Whether the program itself has initialised CUDA (asking never initialises it).

    ``torch.cuda.is_available()`` and friends may initialise the CUDA driver in a
    process that had not done so (breaking a later fork, costing memory on every GPU):
    the reporter asks torch.cuda anything only once this is True.
    """
    try:
        return bool(torch.cuda.is_initialized())  # reads a flag; initialises nothing
    except Exception:
        return False


def nccl_version(torch: Any) -> str | None:
    """NCCL's version once the program has initialised CUDA, else None (asked again later)."""
    if not cuda_initialised(torch):
        return None
    try:
        nccl = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)


def reported_env() -> dict[str, str]:
    """NCCL_*, TORCH_*, CUDA_*, OMP_* (and kin) with secrets masked."""
    return filter_env(dict(os.environ))


def param_fingerprint(wrapper: str, module: Any) -> ParamFingerprint:
    """Count, element total and shape hash of *module*'s parameters (no values).

    A DTensor parameter (FSDP2's ``fully_shard``, tensor parallel) holds a local shard
    whose size differs across ranks when a dimension does not divide evenly: its
    ``shape`` and ``numel()`` are the global ones, and the hash also covers its
    placements and mesh shape, so ranks compare what they agreed on, not their shards.
    """
    digest = hashlib.blake2b(digest_size=8)
    shapes: list[tuple[str, list[int]]] = []
    count = numel = sharded = 0
    for name, param in module.named_parameters():
        shape = [int(d) for d in param.shape]
        layout = _placement(param)
        if layout:
            sharded += 1
        digest.update(f"{name}:{shape}{layout};".encode())
        count += 1
        numel += int(param.numel())
        if len(shapes) < MAX_SHAPES:
            shapes.append((name, shape))
    return ParamFingerprint(count=count, numel=numel, shapes_hash=digest.hexdigest(),
                            wrapper=wrapper, shapes=shapes, dtensors=sharded)


def _placement(param: Any) -> str:
    """``@(Shard(dim=0),)/mesh(2,)`` for a DTensor, "" for a plain tensor."""
    placements = getattr(param, "placements", None)
    if placements is None:
        return ""
    mesh = getattr(param, "device_mesh", None)
    mesh_shape = tuple(int(d) for d in getattr(mesh, "shape", ()) or ())
    return f"@{tuple(str(pl) for pl in placements)}/mesh{mesh_shape}"


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
