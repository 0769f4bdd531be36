"""Hypothesis strategies for ddptop's wire messages and hostile byte streams.

Shared by the property tests and ``bench/fuzz.py``. Generated values respect the
protocol's length caps (anything longer is refused by design, tested separately) and
use finite floats, so that decode(encode(m)) == m is a fair property.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from ddptop.protocol import (
    AuthProof,
    AuthResult,
    CollectiveGroup,
    ConnectionEvent,
    ErrorMsg,
    FrameStack,
    FrTraceMsg,
    Hello,
    HistoryMsg,
    Message,
    PendingOp,
    RankState,
    RecordEntry,
    ReporterStats,
    Request,
    Sample,
    StacksMsg,
    StateMsg,
    ThreadStack,
)
from ddptop.wire import LENGTH, encode_frame, header_bytes

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
small = st.integers(min_value=0, max_value=1 << 20)
floats = st.floats(allow_nan=False, allow_infinity=False)
opt_floats = st.none() | floats
text = st.text(max_size=40)
short_lists = {"max_size": 4}

pending_ops = st.builds(PendingOp, seq=small, op=text,
                        sizes=st.lists(st.lists(st.lists(small, max_size=4), max_size=3), max_size=2),
                        dtype=text, age_s=floats, started_at=floats, timeout_s=opt_floats, state=text)
groups = st.builds(CollectiveGroup, pg=text, seq=small, desc=text, size=small, backend=text,
                   timeout_s=opt_floats, pending=st.lists(pending_ops, **short_lists),
                   seq_changed_at=floats, enqueue_times=st.lists(st.tuples(small, floats), **short_lists))
rank_states = st.builds(
    RankState, rank=small, local_rank=small, world_size=small, host=text, pid=small, job_id=text,
    status=text, time=floats, step=ints, step_time_s=opt_floats, epoch=small, batch=small,
    batches_per_epoch=st.none() | small, data_wait_fraction=opt_floats,
    loader_worker_pids=st.lists(small, **short_lists), backend=text,
    collectives=st.lists(groups, max_size=2), cpu_percent=opt_floats, rss_bytes=st.none() | small,
    load_avg=st.lists(floats, max_size=3), env=st.dictionaries(text, text, max_size=4),
    exit_reason=text,
    reporter=st.builds(ReporterStats, errors=small, dropped=small, last_error=text, rate_limited=small),
)
samples = st.builds(Sample, time=floats, step=small, epoch=small, batch=small, seq=small,
                    step_time_s=opt_floats, data_wait_fraction=opt_floats,
                    loader_ready_batches=st.none() | small, cpu_percent=opt_floats,
                    rss_bytes=st.none() | small, gpu_util_percent=opt_floats)
thread_stacks = st.builds(ThreadStack, thread_id=small, name=text, is_main=st.booleans(),
                          frames=st.lists(st.builds(FrameStack, file=text, line=small, function=text),
                                          **short_lists))
replies = (
    st.builds(StateMsg, state=rank_states, id=small)
    | st.builds(HistoryMsg, rank=small, samples=st.lists(samples, **short_lists), id=small)
    | st.builds(StacksMsg, rank=small, time=floats, threads=st.lists(thread_stacks, max_size=3), id=small)
    | st.builds(FrTraceMsg, rank=small, time=floats, json=text, error=text, id=small)
    | st.builds(ErrorMsg, reason=text, id=small)
)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Hello, protocol=small, role=text, nonce=st.text(max_size=64), auth_required=st.booleans(),
              rank=st.none() | small, job_id=text),
    st.builds(AuthProof, mac=st.text(max_size=64)),
    st.builds(AuthResult, ok=st.booleans(), reason=text),
    st.builds(Request, command=st.text(max_size=20), id=small),
    replies,
    st.builds(RecordEntry, time=floats, rank=small, message=replies),
    st.builds(ConnectionEvent, time=floats, rank=small, status=text, reason=text),
)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """*data* cut into chunks at arbitrary points (every chunking is a possible recv)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def stream_of(msgs: list[Message]) -> bytes:
    """Header plus one frame per message."""
    return header_bytes() + b"".join(encode_frame(m) for m in msgs)


# Bytes a hostile peer might send: raw garbage, or a valid header then garbage frames,
# plausible lengths with random payloads, and valid frames with corrupted bytes.
hostile_streams = st.one_of(
    st.binary(max_size=256),
    st.binary(max_size=256).map(lambda b: header_bytes() + b),
    st.lists(st.binary(max_size=40).map(lambda p: LENGTH.pack(len(p)) + p), max_size=6)
    .map(lambda frames: header_bytes() + b"".join(frames)),
    st.tuples(st.lists(messages, min_size=1, max_size=3), st.integers(0, 10**6), st.integers(0, 255))
    .map(lambda t: _flip(stream_of(t[0]), t[1], t[2])),
)


def _flip(data: bytes, where: int, value: int) -> bytes:
    out = bytearray(data)
    out[where % len(out)] = value
    return bytes(out)
