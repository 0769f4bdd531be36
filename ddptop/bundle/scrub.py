"""Secrets never leave the host: every frame is scrubbed again before it is written.

The reporter already filters its environment; this is defence in depth for frames from
older reporters and for free text (exception messages, crash files, FR traces) where a
key could hide under an innocent name.
"""

from __future__ import annotations

import msgspec

from ddptop.bundle.format import CrashFile, FindingsRecord, Frame
from ddptop.protocol import ConnectionEvent, ErrorMsg, FrTraceMsg, RankState, RecordEntry, StateMsg
from ddptop.secrets_filter import MASK, filter_env, is_secret_name, mask_value


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """The reportable subset of *env*, secret names masked, key-like values masked."""
    kept = filter_env(env)
    # filter_env masks by name and value already; a second pass over every kept value
    # costs little and catches a secret name filter_env's prefix list let through.
    return {k: MASK if is_secret_name(k) else mask_value(v) for k, v in kept.items()}


def scrub_state(state: RankState) -> RankState:
    """*state* with its environment and free-text fields scrubbed."""
    return msgspec.structs.replace(
        state, env=scrub_env(state.env), exit_reason=mask_value(state.exit_reason),
        reporter=msgspec.structs.replace(state.reporter, last_error=mask_value(state.reporter.last_error)),
    )


def scrub_frame(frame: Frame) -> Frame:
    """A copy of *frame* safe to write (frames without free text are returned as is)."""
    if isinstance(frame, RecordEntry):
        msg = frame.message
        if isinstance(msg, StateMsg):
            state = msgspec.structs.replace(msg, state=scrub_state(msg.state))
            return msgspec.structs.replace(frame, message=state)
        if isinstance(msg, FrTraceMsg):
            fr = msgspec.structs.replace(msg, json=mask_value(msg.json), error=mask_value(msg.error))
            return msgspec.structs.replace(frame, message=fr)
        if isinstance(msg, ErrorMsg):
            error = msgspec.structs.replace(msg, reason=mask_value(msg.reason))
            return msgspec.structs.replace(frame, message=error)
        return frame
    if isinstance(frame, ConnectionEvent):
        return msgspec.structs.replace(frame, reason=mask_value(frame.reason))
    if isinstance(frame, CrashFile):
        return msgspec.structs.replace(frame, text=mask_value(frame.text))
    if isinstance(frame, FindingsRecord):
        findings = [msgspec.structs.replace(f, title=mask_value(f.title),
                                            evidence=[mask_value(e) for e in f.evidence])
                    for f in frame.findings]
        return msgspec.structs.replace(frame, findings=findings, error=mask_value(frame.error))
    return frame
