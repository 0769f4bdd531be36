"""The HTTP side of fleet metrics: where ``/metrics`` listens, and a server that a flood cannot sink.

Kept apart from :mod:`ddptop.agent.metrics` so that ``ddptop launch`` can check a
``--metrics-port`` value before the job starts without importing ``prometheus_client``
(it is imported only when metrics are served). The server is prometheus_client's WSGI app
(content negotiation, OpenMetrics, gzip) on a thread-per-request server like its own, with
two bounds it lacks: a client that connects and says nothing is dropped after
``REQUEST_TIMEOUT_S``, and beyond ``MAX_SCRAPES_AT_ONCE`` concurrent connections new ones
are closed at once, so a local flood costs neither the agent's memory nor its threads.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from ddptop.errors import UsageError

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

METRICS_PORT_ENV = "DDPTOP_METRICS_PORT"
MAX_SCRAPES_AT_ONCE = 8  # more concurrent connections are closed at once, never queued
REQUEST_TIMEOUT_S = 10.0  # a client that connects and says nothing is dropped after this


def parse_listen(text: str) -> tuple[str, int]:
    """``"9400"`` -> every interface; ``"127.0.0.1:9400"``, ``"[::1]:0"`` (0: any free port)."""
    spec = text.strip()
    addr, _, port = spec.rpartition(":")
    addr = addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr
    if not port.isdigit() or int(port) > 65535 or (":" in addr and not spec.startswith("[")):
        raise UsageError(f"metrics port {text[:60]!r}: give PORT, ADDR:PORT or [IPV6]:PORT")
    return addr or "0.0.0.0", int(port)


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a scrape every few seconds must not fill the launcher's stderr."""


class _Server(ThreadingMixIn, WSGIServer):
    """prometheus_client's thread-per-request server, with a bound on concurrent requests."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64  # socketserver's 5 makes a burst of scrapers wait for SYN retries

    def __init__(self, address: tuple[str, int]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(MAX_SCRAPES_AT_ONCE)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # a flood gets closed sockets, never our memory
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsServer:
    """``/metrics`` of *registry* on *listen*, served from a daemon thread until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, listen: tuple[str, int]) -> None:
        from prometheus_client import make_wsgi_app

        self._httpd = _Server(listen)  # OSError (address in use...) goes to the caller
        self._httpd.set_app(make_wsgi_app(registry))
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="ddptop-metrics", daemon=True)
        self._thread.start()
        host = listen[0]
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving (returns within the server's poll interval)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=2.0)
