"""What each collective requires to be equal across the ranks of its group: one table.

Every rule that compares ranks' ops (live pending ops, dumped collectives, last words, the
table's marks) asks :func:`signature`: two ranks at the same seq of one group ran
*different* collectives only where their signatures differ. A size difference counts only
where the op demands equal sizes:

* equal sizes and dtypes: ``all_reduce``, ``broadcast``, ``reduce``,
  ``all_gather_into_tensor`` (``_allgather_base``), ``reduce_scatter_tensor``
  (``_reduce_scatter_base``) and their ``_coalesced`` forms;
* per-rank sizes by design: ``all_to_all`` / ``all_to_all_single`` (splits: an MoE
  dispatcher sends what its router chose), ``all_gather`` of a list (uneven outputs make
  uneven inputs: only the output list must agree), ``reduce_scatter`` of a list (the
  reverse), ``gather`` (outputs on the root only), ``scatter`` (inputs on the root only),
  the ``_v`` forms;
* the op alone: ``barrier``, ``coalesced`` groups (their members are not in the entry);
* p2p (``send``/``recv``): pairs, never compared as a collective (:func:`is_p2p`).

Names are FR's ``profiling_name`` as written ("nccl:all_reduce", "gloo:all_to_all",
"nccl:send 0->1"); an unknown op keeps the strict rule (equal sizes), since a mismatch
of a plain collective is what a hang most often is. Torch's own analyser
(torch/distributed/flight_recorder) exempts only ``all_to_all`` and reads
``all_to_all_single``'s uneven inputs as a mismatch: the healthy ranks of every MoE job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Literal, NamedTuple

from ddptop.rank_state import PendingOp

Compare = Literal["all", "outputs", "inputs", "dtype", "op"]


class OpRule(NamedTuple):
    """What one collective requires across ranks: which sizes (``all``: inputs and outputs;
    ``outputs``/``inputs``: that side only; ``dtype``: no size; ``op``: the name alone)."""

    compare: Compare
    why: str  # said where two ranks differ only in what the op allows


_EQUAL = OpRule("all", "")
_A2A = OpRule("dtype", "all_to_all sends per-rank splits: sizes differ by design (token routing)")
RULES: dict[str, OpRule] = {
    **dict.fromkeys(("all_reduce", "allreduce", "broadcast", "_broadcast_oop", "reduce", "_reduce_oop",
                     "_allgather_base", "_all_gather_base", "all_gather_into_tensor",
                     "all_gather_into_tensor_coalesced", "_reduce_scatter_base", "reduce_scatter_tensor",
                     "reduce_scatter_tensor_coalesced", "allreduce_coalesced", "all_reduce_coalesced",
                     "sparse_all_reduce"), _EQUAL),
    **dict.fromkeys(("all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_to_allv",
                     "all_to_all_v_single", "all_to_all_v"), _A2A),
    "all_gather": OpRule("outputs", "all_gather of a list: each rank's input is its own slot (uneven lists)"),
    "all_gather_v": OpRule("outputs", "all_gather_v: per-rank inputs by design"),
    "all_gather_single": OpRule("outputs", "all_gather_single: per-rank inputs by design"),
    "reduce_scatter": OpRule("inputs", "reduce_scatter of a list: each rank's output is its own slot"),
    "reduce_scatter_v": OpRule("inputs", "reduce_scatter_v: per-rank outputs by design"),
    "reduce_scatter_single": OpRule("inputs", "reduce_scatter_single: per-rank outputs by design"),
    "gather": OpRule("inputs", "gather: only the root holds the output list"),
    "scatter": OpRule("outputs", "scatter: only the root holds the input list"),
    **dict.fromkeys(("barrier", "all_reduce_barrier", "coalesced", "ALLGATHER_coalesced",
                     "REDUCE_SCATTER_coalesced", "allgather_coalesced"),
                    OpRule("op", "a barrier or a coalesced group: the entry carries no comparable size")),
}
_P2P_NAMES = frozenset(("send", "recv", "recvAnySource", "recv_any_source"))
_NAME = re.compile(r"^(?:[A-Za-z0-9_]{1,16}:)?\s*([A-Za-z_][A-Za-z0-9_]{0,63})")


@lru_cache(maxsize=1024)  # a job has a few dozen op names; asked for every rank's op
def base_name(op: str) -> str:
    """'nccl:send 0->1' -> 'send'; 'gloo:all_to_all' -> 'all_to_all'; 'ALLREDUCE' -> 'all_reduce'."""
    m = _NAME.match(op.strip())
    name = m.group(1) if m else op
    return _WATCHDOG_NAMES.get(name, name)


# NCCL's watchdog and the ProcessGroupWrapper write OpType in upper case (ALLREDUCE, _ALLGATHER_BASE).
_WATCHDOG_NAMES = {
    "ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "REDUCE": "reduce", "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "_allgather_base", "ALLGATHER_COALESCED": "allgather_coalesced",
    "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "_reduce_scatter_base",
    "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all", "GATHER": "gather", "SCATTER": "scatter",
    "BARRIER": "barrier", "SEND": "send", "RECV": "recv", "RECVANYSOURCE": "recv",
    "COALESCED": "coalesced", "ALLREDUCE_COALESCED": "allreduce_coalesced",
}


def rule_of(op: str) -> OpRule:
    """The table's rule for op name *op* (strict where the op is unknown)."""
    return RULES.get(base_name(op), _EQUAL)


def is_p2p(op: PendingOp) -> bool:
    """A send or recv: matched in pairs, never compared with a group's collectives."""
    return op.is_p2p or base_name(op.op) in _P2P_NAMES


def sizes_differ_allowed(op: str) -> bool:
    """True where ranks of one collective may carry different sizes (all_to_all, gather...)."""
    return rule_of(op).compare != "all"


Signature = tuple[str, str, str]


def signature(op: PendingOp) -> Signature:
    """What must be equal on every rank of *op*'s group at its seq: (op, sizes, dtype), with
    the parts the op lets differ left empty. Backend prefixes are kept out: one name."""
    name = base_name(op.op)
    return _signed(op, name, RULES.get(name, _EQUAL).compare)


def _signed(op: PendingOp, name: str, compare: Compare) -> Signature:
    sizes = op.sizes
    if compare == "all":
        shown = repr(sizes) if sizes else ""
    elif compare == "outputs":
        shown = repr(sizes[1]) if len(sizes) > 1 else ""
    elif compare == "inputs":
        shown = repr(sizes[0]) if sizes else ""
    else:
        shown = ""
    return name, shown, "" if compare == "op" else op.dtype


def signer() -> Callable[[PendingOp], Signature | None]:
    """:func:`signature` for the many ops of one diagnosis (every rank's in a hang at 32,768
    ranks), the table looked up once per op name; None for a send or recv (pairs)."""
    names: dict[str, tuple[str, Compare] | None] = {}

    def sign(op: PendingOp) -> Signature | None:
        if op.op in names:
            known = names[op.op]
        else:
            base = base_name(op.op)
            known = names[op.op] = None if base in _P2P_NAMES else (base, RULES.get(base, _EQUAL).compare)
        if known is None or op.is_p2p:
            return None
        return _signed(op, *known)
    return sign


def allowed_difference(ops: list[PendingOp]) -> str:
    """Why *ops* (one per rank, same group and seq, one signature) may still differ in size:
    the table's words where their sizes differ and the op allows it, else ''."""
    sizes = {repr(op.sizes) for op in ops}
    if len(sizes) < 2 or not ops:
        return ""
    return rule_of(ops[0].op).why
