"""The socket engine: one selector loop, one way to move frames, one set of limits.

``loop``: the selector loop (with its wake-up pair) that a rank's server, the node agent's
endpoint and the viewer's live source each run their sockets on; ``stream``: the read and
write halves every peer shares; ``peers``: a listening socket's connections, admitted,
timed and drained within the limits; ``server``: the protocol spoken over them (handshake,
requests, broadcasts) by a rank and by a node agent; ``limits``: peers, rate limits, the
counters a rank reports. The viewer's side of a connection (its handshake and requests) is
:mod:`ddptop.client.live`.

Standard library, msgspec and the wire/protocol modules only: ranks run it.
"""
