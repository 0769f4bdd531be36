"""Properties that hold for every input: the frame decoder, protocol structs, the
handshake (auth and a real server), and the bundle reader.

Every input gets a clean result or ddptop's own one-line error (ProtocolError,
BundleError), never another exception. Hypothesis runs derandomized in this suite
(tests/conftest.py), so a run is repeatable; ``bench/fuzz.py`` explores far more.
"""

from __future__ import annotations

import gzip
import socket
import tempfile
import time
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ddptop import auth
from ddptop.bundle.reader import Contents, read_file
from ddptop.errors import BundleError, ProtocolError
from ddptop.protocol import AuthProof, AuthResult, Hello, Message, Request, StateMsg
from ddptop.wire import FrameBuffer, encode_frame, header_bytes
from tests.servers import TOKEN, healthy_state, serving
from tests.strategies import chunked, hostile_streams, messages, stream_of

# msgpack-shaped values of any structure: what a peer could encode, typed or not.
json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)


def _decode_all(chunks: list[bytes]) -> list[Message]:
    buf = FrameBuffer()
    out: list[Message] = []
    for chunk in chunks:
        out += buf.feed(chunk)
    return out


@given(st.data(), hostile_streams)
def test_frame_decoder_gives_messages_or_protocol_error(data: st.DataObject, stream: bytes) -> None:
    """Any bytes, cut anywhere: messages, or a ProtocolError; never another exception."""
    chunks = data.draw(chunked(stream))
    try:
        got = _decode_all(chunks)
    except ProtocolError as exc:
        assert "\n" not in str(exc)
        return
    assert all(isinstance(m, msgspec.Struct) for m in got)


@given(st.data(), st.lists(messages, max_size=5))
def test_encode_decode_round_trip(data: st.DataObject, msgs: list[Message]) -> None:
    """Every message decodes to itself, whatever the chunking of the stream."""
    assert _decode_all(data.draw(chunked(stream_of(msgs)))) == msgs


@given(st.text(max_size=12), json_like)
def test_protocol_structs_decode_any_msgpack(tag: str, value: object) -> None:
    """Any msgpack value, tagged as any message type or not: a message or a ProtocolError."""
    for candidate in (value, {"type": tag, **value} if isinstance(value, dict) else value):
        payload = msgspec.msgpack.encode(candidate)
        try:
            got = FrameBuffer().feed(header_bytes() + len(payload).to_bytes(4, "big") + payload)
        except ProtocolError:
            continue
        assert len(got) == 1 and isinstance(got[0], msgspec.Struct)


@given(st.text(min_size=1, max_size=64), st.text(max_size=64), st.text(max_size=64))
def test_auth_proof_binds_token_and_nonce(token: str, nonce: str, other: str) -> None:
    """The proof verifies for its own token and nonce only."""
    assume(other not in (token, nonce))
    mac = auth.prove(token, nonce)
    assert auth.verify(token, nonce, mac)
    assert not auth.verify(token, other, mac)
    assert not auth.verify(other, nonce, mac)


def _converse(port: int, proof: str, reqs: list[Request], junk: bytes) -> list[Message]:
    """Handshake with *proof* ("right", "wrong" or "none"), then send *reqs* and *junk*;
    return what the server said until it closed or went quiet."""
    got: list[Message] = []
    buf = FrameBuffer()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(0.3)
        sock.sendall(header_bytes())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            before = len(got)
            got += buf.feed(data)
            for message in got[before:]:
                out = b""
                if isinstance(message, Hello):
                    assert message.auth_required
                    key = TOKEN if proof == "right" else "not the token"
                    out = (encode_frame(AuthProof(mac=auth.prove(key, message.nonce))) if proof != "none"
                           else b"".join(encode_frame(r) for r in reqs) + junk)
                elif isinstance(message, AuthResult) and message.ok:
                    out = b"".join(encode_frame(r) for r in reqs) + junk
                try:
                    sock.sendall(out)
                except OSError:
                    return got
    return got


def test_handshake_never_serves_without_a_valid_proof() -> None:
    """A real server: whatever a peer sends, state is served only after the right proof."""
    with serving(token=TOKEN) as srv:

        @settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
        @given(st.sampled_from(["right", "wrong", "none"]),
               st.lists(st.builds(Request, command=st.sampled_from(["state", "history", "exec", "subscribe"]),
                                  id=st.integers(1, 1000)), max_size=4),
               st.binary(max_size=30))
        def check(proof: str, reqs: list[Request], junk: bytes) -> None:
            got = _converse(srv.server.port, proof, reqs, junk)
            served = [m for m in got if isinstance(m, StateMsg)]
            verdicts = [m.ok for m in got if isinstance(m, AuthResult)]
            if proof == "right":
                assert verdicts == [True]
            else:
                assert served == [] and True not in verdicts

        check()
        healthy_state(srv, token=TOKEN)


_tmp = Path(tempfile.mkdtemp(prefix="ddptop-prop-"))


def _read_bytes(data: bytes) -> Contents | None:
    path = _tmp / "f.ddptop"
    path.write_bytes(data)
    try:
        return read_file(path)
    except BundleError as exc:
        assert "\n" not in str(exc)
        return None


@settings(max_examples=200)
@given(st.binary(max_size=512) | hostile_streams | hostile_streams.map(gzip.compress))
def test_bundle_reader_any_bytes(data: bytes) -> None:
    """Any file content: a Contents or a one-line BundleError, nothing else."""
    got = _read_bytes(data)
    assert got is None or isinstance(got, Contents)


def _valid_recording() -> bytes:
    from ddptop.bundle import format as fmt
    from ddptop.bundle.format import Manifest
    from ddptop.bundle.writer import BundleWriter
    from ddptop.testing.bundles import recording_events

    path = _tmp / "valid.ddptop"
    writer = BundleWriter(path, Manifest(schema_version=fmt.SCHEMA_VERSION, kind="recording", created=1.0,
                                         job_id="j", world_size=2, ddptop_version="0"),
                          flush_interval_s=0.0)
    for event in recording_events(2, 5):
        writer.write(event)
    writer.close("test")
    return path.read_bytes()


VALID = _valid_recording()


@settings(max_examples=100)
@given(st.integers(0, len(VALID)))
def test_bundle_reader_cut_recording(cut: int) -> None:
    """A real recording cut anywhere: what came before the cut, or a BundleError."""
    got = _read_bytes(VALID[:cut])
    assert got is None or got.manifest.job_id == "j"


@settings(max_examples=200)
@given(st.integers(0, len(VALID) - 1), st.integers(0, 255))
def test_bundle_reader_corrupted_recording(where: int, value: int) -> None:
    """A real recording with any byte changed: a Contents or a BundleError."""
    data = bytearray(VALID)
    data[where] = value
    got = _read_bytes(bytes(data))
    assert got is None or isinstance(got, Contents)
