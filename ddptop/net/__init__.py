"""The socket engine: one selector loop, one way to move frames, one set of limits.

``loop``: the selector loop (with its wake-up pair) that a rank's server, the node agent's
endpoint and the viewer's live source each run their sockets on; ``stream``: the read and
write halves every peer shares; ``server``: the serving side (handshake, requests, per-peer
output caps) of a rank and of a node agent; ``limits``: peers, rate limits, the counters a
rank reports. The viewer's side of a connection (its handshake and requests) is
:mod:`ddptop.client.live`.

Standard library, msgspec and the wire/protocol modules only: ranks run it.
"""
