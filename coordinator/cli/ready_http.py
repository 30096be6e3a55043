"""``coordinator worker --ready-listen``: a tiny HTTP readiness endpoint for a worker pool.

Any GET answers ``200 claiming`` while the pool claims and ``503 not claiming`` from the moment
it stops, or while every slot is held by a handler that outlived its lost claim (an httpGet
readiness probe). It is served by the bounded server the metrics use
(server/bounded_http.py): one loop thread and one worker thread whatever the probes do.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable
from typing import Any

from coordinator.errors import ConfigError


class ReadyEndpoint:
    """A Readiness (sdk/readiness.py) answered over HTTP on ``listen`` (``host:port``)."""

    def __init__(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, int(port)), family=family)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--ready-listen: cannot bind {listen!r}: {exc}") from exc
        # Imported here: the server package (and the store behind it) would otherwise load for
        # every `coordinator worker`, also those that serve no readiness endpoint.
        from coordinator.server.bounded_http import BoundedHttpServer, HttpLimits

        limits = HttpLimits(read_timeout=5.0, max_connections=8, workers=1)
        self._ready = False
        self._server = BoundedHttpServer(self._app, sock, limits)
        self.port = self._server.port

    def set_ready(self, ready: bool) -> None:
        """Answer 200 (True) or 503 (False) from now on."""
        self._ready = ready  # one reference swap: the probe thread reads it without a lock

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self._ready:
            status, body = "200 OK", b"claiming\n"
        else:
            status, body = "503 Service Unavailable", b"not claiming\n"
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
