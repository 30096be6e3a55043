"""A small HTTP server for one WSGI app whose cost has a bound, whatever its clients do.

The standard library's servers (and prometheus_client's ``start_http_server``) spend one thread
per connection and wait on it with no deadline: 500 idle connections were 500 threads. Here one
event-loop thread holds every connection while its request arrives, and a fixed pool of
``workers`` threads runs the app only for a request that has fully arrived. So:

* an idle connection costs a socket, never a thread;
* a connection must deliver its whole request head (and finish its TLS handshake) within
  ``read_timeout`` seconds in total, not per byte, or it is closed; writing the answer has the
  same deadline;
* at most ``max_connections`` are open. Past that, the oldest connection still waiting for its
  request is closed to admit the new one (a scraper sends its request at once, so a flood of
  idle connections cannot lock it out); if every open connection is being answered, the new
  one gets ``503`` and is closed;
* a request head of more than ``MAX_HEADERS`` header lines gets ``431``, one of a header line
  http.client refuses ``400``, never a traceback.

One request per connection (``Connection: close``): Prometheus reconnects per scrape anyway.
"""

from __future__ import annotations

import asyncio
import io
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException, parse_headers
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote
from wsgiref.handlers import SimpleHandler
from wsgiref.types import WSGIApplication

import structlog

log = structlog.get_logger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""A request head longer than this is refused (a scrape's is a few hundred bytes)."""

_REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_TOO_MANY_HEADERS = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
)
MAX_HEADERS = 99
"""Header lines a request may carry: http.client's parser allows 100 lines with the empty one
that ends them, and past that raised HTTPException, no ValueError, so every such request logged
a traceback."""


@dataclass(frozen=True)
class HttpLimits:
    """What one server may spend: seconds per connection, open sockets, threads."""

    read_timeout: float = 10.0
    """Deadline for a connection's TLS handshake plus request head, and for writing the answer."""
    max_connections: int = 64
    """Open connections at once (waiting for their request or being answered)."""
    workers: int = 2
    """Threads that run the app (requests answered at once)."""


class _Handler(SimpleHandler):
    """Runs the app on one parsed request and writes the HTTP response into a buffer."""

    os_environ: Any = MappingProxyType(
        {}
    )  # never copy the process environment (etcd password) into a request
    http_version = "1.1"
    server_software = "coordinator"

    def cleanup_headers(self) -> None:
        """Content-Length as usual, and one request per connection."""
        super().cleanup_headers()
        self.headers["Connection"] = "close"  # type: ignore[attr-defined]  # set by start_response


class BoundedHttpServer:
    """Serves ``app`` on a bound socket within ``limits``; ``close()`` stops it.

    ``tls`` (optional) returns the SSL context for each new connection, so a rotated
    certificate is used from the next connection on.
    """

    def __init__(
        self,
        app: WSGIApplication,
        sock: socket.socket,
        limits: HttpLimits,
        *,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self._app, self._sock, self._limits, self._tls = app, sock, limits, tls
        host, port = sock.getsockname()[:2]
        self.port: int = port
        self._environ = {"SERVER_NAME": str(host), "SERVER_PORT": str(port)}
        self._pool = ThreadPoolExecutor(limits.workers, thread_name_prefix="metrics-http")
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        # Every open connection, and those still waiting for their request, oldest first.
        self._open: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._waiting: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-http-loop", daemon=True)
        self._thread.start()
        self._started.wait()

    def close(self) -> None:
        """Stop accepting, close every connection, free the port."""
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._connected, sock=self._sock, limit=MAX_HEAD_BYTES)
        self._started.set()
        async with server:
            await self._stop.wait()
        # Aborted, not cancelled: each connection's own code ends it and cleans up.
        for writer in self._open.values():
            writer.transport.abort()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.gather(*others, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if not self._admit(writer):
            writer.write(_REFUSED)  # buffered by the transport: never blocks the loop
            writer.close()
            return
        self._open[task] = writer
        self._waiting[task] = writer
        try:
            async with asyncio.timeout(self._limits.read_timeout):
                head = await self._read_head(reader, writer)
            del self._waiting[task]
            response = await self._loop.run_in_executor(self._pool, self._respond, head)
            async with asyncio.timeout(self._limits.read_timeout):
                writer.write(response)
                writer.close()
                await writer.wait_closed()  # the whole answer sent, or the deadline
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # a slow, silent or vanished client
        except asyncio.LimitOverrunError:
            writer.write(_BAD_REQUEST)
        finally:
            self._waiting.pop(task, None)
            self._open.pop(task, None)
            # Whatever is still open now missed its deadline: drop it, unsent bytes and all.
            writer.transport.abort()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Make room for one more connection; False when every open one is being answered."""
        if len(self._open) < self._limits.max_connections:
            return True
        if not self._waiting:
            log.warning("metrics: connection refused, every slot is answering a request")
            return False
        oldest, idle = next(iter(self._waiting.items()))
        del self._waiting[oldest]
        del self._open[oldest]
        idle.transport.abort()  # its read ends with IncompleteReadError
        return True

    async def _read_head(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        if self._tls is not None:
            await writer.start_tls(self._tls())
        return await reader.readuntil(b"\r\n\r\n")

    def _respond(self, head: bytes) -> bytes:
        """The whole HTTP response of the app to one request head (runs in a worker)."""
        out = io.BytesIO()
        # The head ends with an empty line: a request line, its headers, then two CRLFs.
        if head.count(b"\r\n") - 2 > MAX_HEADERS:
            return _TOO_MANY_HEADERS
        try:
            environ = self._environ | _environ_of(head)
        except (ValueError, HTTPException):  # not HTTP, or a header line http.client refuses
            return _BAD_REQUEST
        handler = _Handler(io.BytesIO(), out, sys.stderr, environ, multithread=True)
        handler.run(self._app)
        return out.getvalue()


def _environ_of(head: bytes) -> dict[str, str]:
    """The WSGI variables of a request head; ValueError if it is not HTTP."""
    line, _, rest = head.partition(b"\r\n")
    method, target, version = line.decode("latin-1").split(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not HTTP/1.x: {version!r}")
    path, _, query = target.partition("?")
    headers = parse_headers(io.BytesIO(rest))
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": unquote(path, "latin-1"),
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": version,
    }
    for name, value in headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ
