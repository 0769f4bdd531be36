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


def param_fingerprint(wrapper: str, module: Any, zero_stage: int | None = None) -> ParamFingerprint:
    """Count, element total and shape hash of *module*'s parameters (no values).

    A DTensor parameter (FSDP2's ``fully_shard``, tensor parallel) holds a local shard
    whose size differs across ranks when a dimension does not divide evenly: its
    ``shape`` and ``numel()`` are the global ones, and the hash also covers its
    placements and mesh shape, so ranks compare what they agreed on, not their shards.
    A ZeRO-3 parameter (DeepSpeed, *zero_stage* given) keeps its global shape in
    ``ds_shape`` while its data may be an empty placeholder: the global shape is hashed,
    and what the rank holds (its partition, ``ds_tensor``) is counted in ``held_numel``.
    """
    digest = hashlib.blake2b(digest_size=8)
    shapes: list[tuple[str, list[int]]] = []
    count = numel = sharded = partitioned = held = 0
    for name, param in module.named_parameters():
        ds_shape = getattr(param, "ds_shape", None)
        if ds_shape is not None:  # ZeRO-3 (zero.Init, or the engine's partitioning)
            shape = [int(d) for d in ds_shape]
            size = int(getattr(param, "ds_numel", 0) or _product(shape))
        else:
            shape = [int(d) for d in param.shape]
            size = int(param.numel())
        layout = _placement(param)
        if layout:
            sharded += 1
        digest.update(f"{name}:{shape}{layout};".encode())
        count += 1
        numel += size
        if zero_stage is not None:
            part = _zero3_partition(param)
            partitioned += part is not None
            held += part if part is not None else size
        if len(shapes) < MAX_SHAPES:
            shapes.append((name, shape))
    return ParamFingerprint(count=count, numel=numel, shapes_hash=digest.hexdigest(),
                            wrapper=wrapper, shapes=shapes, dtensors=sharded, zero_stage=zero_stage,
                            partitioned=partitioned, held_numel=held if zero_stage is not None else None)


def _zero3_partition(param: Any) -> int | None:
    """Elements of the partition a ZeRO-3 parameter holds while its data is released (the
    placeholder is empty); None for a parameter whose data is whole here (ZeRO 0-2, a
    persistent or gathered ZeRO-3 parameter)."""
    partition = getattr(param, "ds_tensor", None)
    if partition is None or int(param.numel()) != 0:
        return None
    return int(getattr(partition, "ds_numel", 0) or partition.numel())


def _product(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


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
