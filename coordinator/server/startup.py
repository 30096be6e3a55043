"""Waiting for etcd at start.

On a first install etcd often starts alongside the coordinator. A replica that exited when etcd
did not answer yet would be restarted with a growing back-off (CrashLoopBackOff) and look broken.
Instead it serves health while it waits: liveness SERVING (the process is fine), readiness ("",
every service) NOT_SERVING (no Service routes calls to it), and retries, logging the cause every
few seconds, until etcd answers or it is told to stop.

Something that answers at the endpoint but refuses the first request (a server that is not etcd,
wrong etcd credentials) will not get better by waiting: that is a bad setting, reported as one
(exit 2) with the endpoint and the cause, not a traceback.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.errors import ConfigError, StoreRefused, StoreUnavailable
from coordinator.server.tls import ServerTLS

log = structlog.get_logger(__name__)

T = TypeVar("T")

RETRY_SECONDS = 1.0
"""How often a waiting replica tries etcd again."""
LOG_SECONDS = 5.0
"""How often it says it is still waiting (and why)."""


def wait_for_store(
    open_store: Callable[[], T],
    *,
    etcd: Sequence[str],
    stop: threading.Event,
    listen: str,
    tls: ServerTLS | None,
    health_listen: str | None,
    liveness: str,
    readiness: tuple[str, ...],
) -> T | None:
    """``open_store()`` once etcd answers (StoreUnavailable means "not yet"); None if ``stop``
    is set first. Meanwhile a health-only server answers on the replica's ports. A refusal
    (StoreRefused) raises ConfigError naming the ``etcd`` endpoints."""
    try:
        return _refusal_is_a_setting(open_store, etcd)
    except StoreUnavailable as exc:
        first_error = str(exc)
    server = _health_only(listen, tls, health_listen, liveness, readiness)
    log.warning("etcd not reachable; waiting (readiness NOT_SERVING)", error=first_error)
    try:
        last_log = time.monotonic()
        while not stop.wait(RETRY_SECONDS):
            try:
                store = _refusal_is_a_setting(open_store, etcd)
            except StoreUnavailable as exc:
                if time.monotonic() - last_log >= LOG_SECONDS:
                    log.warning("etcd still not reachable; waiting", error=str(exc))
                    last_log = time.monotonic()
                continue
            log.info("etcd reachable; starting")
            return store
        return None
    finally:
        server.stop(None).wait()


def _refusal_is_a_setting(open_store: Callable[[], T], etcd: Sequence[str]) -> T:
    try:
        return open_store()
    except StoreRefused as exc:
        raise ConfigError(refused_error(etcd, exc)) from exc


def refused_error(etcd: Sequence[str], exc: StoreRefused) -> str:
    """What to say when the etcd endpoint answers but refuses the coordinator's first request."""
    return (
        f"etcd: {', '.join(etcd)} answered but refused the first request ({exc}): is it an etcd "
        "v3 client endpoint (--etcd / COORDINATOR_ETCD), and are the etcd credentials right?"
    )


def _health_only(
    listen: str,
    tls: ServerTLS | None,
    health_listen: str | None,
    liveness: str,
    readiness: tuple[str, ...],
) -> grpc.Server:
    """A server of the health service alone on the replica's ports."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health-wait"),
        options=[("grpc.so_reuseport", 0)],
    )
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set(liveness, health_pb2.HealthCheckResponse.SERVING)
    for name in readiness:
        servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        if tls is not None:
            server.add_secure_port(listen, tls.credentials())
        else:
            server.add_insecure_port(listen)
        if health_listen is not None:
            server.add_insecure_port(health_listen)
    except RuntimeError as exc:  # grpc raises a bare RuntimeError when it cannot bind
        raise ConfigError(bind_error(listen, exc)) from exc
    server.start()
    return server


def ensure_free(listen: str, health_listen: str | None, metrics_listen: str) -> None:
    """ConfigError naming the setting of the first of a replica's addresses (``host:port``)
    another process listens on; None or port 0 is skipped. Checked before etcd is touched: a
    replica that cannot serve exited 2 only after it had started its store (its watches, a
    prune pass) and written to etcd."""
    named = {"listen": listen, "health_listen": health_listen, "metrics_listen": metrics_listen}
    for setting, address in named.items():
        if address is not None and _in_use(address):
            raise ConfigError(bind_error(address, "address already in use", setting))


def _in_use(listen: str) -> bool:
    """Whether another process listens on ``listen`` (a bind as gRPC's, SO_REUSEADDR, fails
    EADDRINUSE). Anything else (port 0, a unix socket, an unknown host, an address not on this
    machine) is the real bind's to report, in its own words."""
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return False
    try:
        (family, kind, proto, _, address), *_ = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


def bind_error(listen: str, why: object, setting: str = "listen") -> str:
    """What to say when the address ``listen`` of ``setting`` cannot be bound, for ``why``
    (gRPC raises a bare RuntimeError; the probe before etcd finds it in use)."""
    flag = f"--{setting.replace('_', '-')} / COORDINATOR_{setting.upper()}"
    return (
        f"{setting}: cannot bind {listen!r} ({why}): is another process listening there? Stop "
        f"it or choose another address ({flag}; port 0 picks a free one)"
    )
