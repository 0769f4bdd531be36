"""The socket engine: the selector server a rank serves its viewers with, and that the node
agent's endpoint is made of (``server``: handshake, requests, per-peer output caps;
``loop``: the selector loop; ``limits``: peers, rate limits, the counters a rank reports).

Standard library, msgspec and the wire/protocol modules only: ranks run it.
"""
