"""The metrics port's HTTP server keeps its bounds whatever clients do: idle connections hold no
thread and cannot lock a scraper out, a silent or trickling connection is closed at its
deadline, a full house is refused with 503, and with TLS it serves the gRPC certificate.

Real sockets on loopback against coordinator.server.bounded_http (and, for TLS, the real
``start_metrics`` over a real store).
"""

from __future__ import annotations

import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from coordinator.server.bounded_http import MAX_HEADERS, BoundedHttpServer, HttpLimits
from coordinator.server.metrics_http import start_metrics
from coordinator.server.tls import ServerTLS
from coordinator.store import Store
from tests.auth.certs import CertificateAuthority
from tests.helpers import eventually

BODY = b"coordinator_up 1\n"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [BODY]


def _serve(limits: HttpLimits, app: Any = _app) -> BoundedHttpServer:
    return BoundedHttpServer(app, socket.create_server(("127.0.0.1", 0)), limits)


def _get(port: int) -> tuple[int, bytes]:
    try:
        with NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset), without blocking."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def test_idle_connections_hold_no_thread_and_a_scrape_still_answers(stack: ExitStack) -> None:
    limits = HttpLimits(read_timeout=60, max_connections=16, workers=2)
    server = _serve(limits)
    stack.callback(server.close)
    threads_before = threading.active_count()

    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
    for sock in idle:
        stack.callback(sock.close)
    # The oldest silent ones are closed to stay within max_connections ...
    eventually(lambda: sum(map(_closed_by_server, idle)) == 300 - limits.max_connections)
    # ... and a scraper is still answered: it takes the oldest silent one's place.
    assert _get(server.port) == (200, BODY)
    eventually(lambda: sum(map(_closed_by_server, idle)) == 300 - limits.max_connections + 1)
    assert [_closed_by_server(s) for s in idle[-limits.max_connections + 1 :]] == [False] * 15
    # No thread per connection: at most the worker pool came up.
    assert threading.active_count() <= threads_before + limits.workers


def test_a_silent_connection_is_closed_after_the_read_timeout(stack: ExitStack) -> None:
    server = _serve(HttpLimits(read_timeout=0.5))
    stack.callback(server.close)
    silent = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
    silent.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the head
    silent.settimeout(10)
    assert silent.recv(100) == b"", "closed without an answer"
    assert _get(server.port) == (200, BODY)


def test_the_read_deadline_is_for_the_whole_head_not_per_byte(stack: ExitStack) -> None:
    server = _serve(HttpLimits(read_timeout=0.5))
    stack.callback(server.close)
    trickle = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))

    def one_more_byte_refused() -> bool:
        try:  # a byte every 50 ms: each read is quick, the head never ends
            trickle.sendall(b"X")
        except ConnectionError:
            return True
        return _closed_by_server(trickle)

    eventually(one_more_byte_refused, timeout=10, message="a trickling client was never closed")


def test_when_every_connection_is_being_answered_a_new_one_gets_503(stack: ExitStack) -> None:
    release, entered = threading.Event(), threading.Semaphore(0)

    def slow(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        entered.release()
        release.wait(30)
        return _app(environ, start_response)

    server = _serve(HttpLimits(read_timeout=30, max_connections=2, workers=2), slow)
    stack.callback(server.close)
    stack.callback(release.set)
    answers: list[tuple[int, bytes]] = []
    busy = [threading.Thread(target=lambda: answers.append(_get(server.port))) for _ in range(2)]
    for thread in busy:
        thread.start()
    for _ in busy:
        assert entered.acquire(timeout=10), "the app was not entered"

    assert _get(server.port) == (503, b"")

    release.set()
    for thread in busy:
        thread.join(timeout=10)
    assert answers == [(200, BODY), (200, BODY)]


def test_metrics_over_tls_serve_the_grpc_certificate(store: Store, tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    cert = ca.issue("server", common_name="localhost", dns=("localhost",), server=True)
    tls = ServerTLS(cert=str(cert.cert), key=str(cert.key))
    metrics = start_metrics(store, "127.0.0.1:0", limits=HttpLimits(read_timeout=2), tls=tls)
    try:
        trusted = ssl.create_default_context(cafile=str(ca.pem.cert))
        https = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=trusted)
        )
        with https.open(f"https://localhost:{metrics.port}/metrics", timeout=10) as response:
            assert response.status == 200
            assert b"coordinator_active_leases" in response.read()
        # Plain HTTP gets no metrics: the server expects a TLS handshake.
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _get(metrics.port)
    finally:
        metrics.close()


def _raw(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


def test_too_many_headers_get_431_without_a_traceback(
    stack: ExitStack, capsys: pytest.CaptureFixture[str]
) -> None:
    server = _serve(HttpLimits())
    stack.callback(server.close)
    headers = b"".join(b"X-H%d: v\r\n" % n for n in range(MAX_HEADERS + 1))
    answer = _raw(server.port, b"GET /metrics HTTP/1.1\r\n" + headers + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    at_the_limit = b"".join(b"X-H%d: v\r\n" % n for n in range(MAX_HEADERS))
    answer = _raw(server.port, b"GET /metrics HTTP/1.1\r\n" + at_the_limit + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert "Traceback" not in capsys.readouterr().err
