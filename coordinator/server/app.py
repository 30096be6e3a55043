"""The gRPC server: three servicers, health and reflection; and ``serve`` for the CLI.

``build_server`` is the factory tests use (bind ``:0``, get the port back). ``serve`` is the
whole life of a replica: connect to etcd, start the store, serve, and on SIGTERM/SIGINT stop
taking calls, let in-flight ones finish, then close the store.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.archive import open_sink
from coordinator.config import Config
from coordinator.domain.roles import Role
from coordinator.domain.stream_limits import StreamLimits
from coordinator.domain.write_budget import (
    DEFAULT_HIGH_WATER_SHARE,
    BudgetPolicy,
    high_water_shares,
)
from coordinator.errors import ConfigError
from coordinator.logging import configure_logging
from coordinator.server.bounded_http import HttpLimits
from coordinator.server.grpc_waits import lengthen_wait_slices
from coordinator.server.health import HealthChecker
from coordinator.server.interceptors.auth import (
    Authenticator,
    AuthInterceptor,
    auth_mode,
    authenticator_for,
    local_default,
    tls_for,
)
from coordinator.server.interceptors.call_log import CallLogInterceptor
from coordinator.server.interceptors.call_shares import CallShareInterceptor, CallShares
from coordinator.server.interceptors.high_water import HighWaterShareInterceptor
from coordinator.server.interceptors.idempotency import IdempotencyInterceptor
from coordinator.server.interceptors.pipeline import Pipeline, Stage
from coordinator.server.interceptors.request_ids import RequestIdInterceptor
from coordinator.server.interceptors.rpc_metrics import RpcMetricsInterceptor
from coordinator.server.interceptors.stream_interceptor import StreamLimitInterceptor
from coordinator.server.interceptors.undecodable import UndecodableInterceptor
from coordinator.server.interceptors.version_gate import (
    VersionGateInterceptor,
    refuse_old_coordinator,
)
from coordinator.server.interceptors.write_budgets import WriteBudgetInterceptor, WriteBudgets
from coordinator.server.metrics_http import start_metrics
from coordinator.server.refusal_log import RefusalLog
from coordinator.server.renew_budget import RENEW_RATE
from coordinator.server.services.admin_service import AdminService
from coordinator.server.services.task_service import TaskService
from coordinator.server.services.worker_service import WorkerService
from coordinator.server.startup import bind_error, ensure_free, wait_for_store
from coordinator.server.streams import OpenStreams
from coordinator.server.tls import ServerTLS
from coordinator.store import EtcdKV, Keyspace, Store
from coordinator.store.control.versions import VersionStore
from coordinator.store.etcd.db_size import DbSizeWatch
from coordinator.store.etcd.history_trim import HistoryTrim
from coordinator.store.etcd.space_guard import SpaceGuard
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

log = structlog.get_logger(__name__)

SERVICE_NAMES = (
    worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    tasks_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)
"""Fully qualified names of the coordinator's services (as health and reflection know them)."""

LIVENESS_SERVICE = "liveness"
"""Health service name that answers SERVING as long as the process serves (liveness probes)."""


def build_server(
    store: Store,
    *,
    listen: str = "127.0.0.1:0",
    max_workers: int = 32,
    calls_per_principal: int = 8,
    renew_rate: float = RENEW_RATE,
    streams: StreamLimits | None = None,
    health_interval: float = 3.0,
    auth: Authenticator | None = None,
    tls: ServerTLS | None = None,
    health_listen: str | None = None,
    write_budgets: Mapping[Role, BudgetPolicy] | None = None,
    high_water_share: float = DEFAULT_HIGH_WATER_SHARE,
    refusals: RefusalLog | None = None,
) -> tuple[grpc.Server, int]:
    """Build, bind and start a server for ``store``; returns it with its bound port.

    ``max_workers`` threads are kept for unary calls, at most ``calls_per_principal`` of them
    for one principal at once (coordinator.server.interceptors.call_shares), which renews at
    most ``renew_rate`` claims a second (coordinator.server.renew_budget); long-lived calls
    (streams) get ``streams.max_streams`` more and are bounded by ``streams``
    (coordinator.server.streams). ``auth`` authenticates every call
    (coordinator.server.interceptors.auth); without one the server is insecure and refuses a
    non-loopback ``listen``. ``tls`` serves TLS (mutual with a
    client CA); ``health_listen`` then adds a plaintext port for kubelet probes, where the
    authenticator admits health checks only. ``write_budgets`` bounds the bytes each principal
    adds to etcd, per role (coordinator.server.interceptors.write_budgets; None: no budget);
    above etcd's high-water mark each principal may still add ``high_water_share`` of its
    budget (coordinator.server.interceptors.high_water).
    ``refusals`` decides which refused calls the call log writes (default: one line per
    principal per 10 s; coordinator.server.refusal_log).

    The server is already started (do not call ``start()`` again); ``server.stop(grace)`` ends
    it and the health checker with it. "liveness" is SERVING while the process serves, whatever
    etcd does (a liveness probe must not restart every replica for an etcd outage); readiness
    is SERVING only while etcd answers, read every ``health_interval`` seconds
    (coordinator.server.health).
    """
    authenticator = _authenticator(auth, listen)
    limits = streams if streams is not None else StreamLimits()
    open_streams = OpenStreams(limits, metrics=store.ctx.metrics)
    budgets = write_budgets or {}
    chain = _Chain(
        calls_per_principal, budgets, high_water_shares(budgets, high_water_share), refusals
    )
    server = _grpc_server(
        max_workers + limits.max_streams,
        _interceptors(store, AuthInterceptor(authenticator), open_streams, chain),
    )
    health_servicer = _add_services(server, store, limits, renew_rate)
    port = _bind(server, listen, tls, health_listen)
    server.start()
    _start_background(
        server,
        HealthChecker(store, health_servicer, server, health_interval, SERVICE_NAMES),
        open_streams,
    )
    return server, port


def _authenticator(auth: Authenticator | None, listen: str) -> Authenticator:
    """``auth``, or the local default for ``listen``; insecure mode is said loudly."""
    authenticator = auth if auth is not None else local_default(listen)
    if authenticator.insecure:
        log.warning(
            "INSECURE MODE: no authentication; callers name their own principal and roles",
            listen=listen,
        )
    return authenticator


def _start_background(
    server: grpc.Server, checker: HealthChecker, open_streams: OpenStreams
) -> None:
    """Liveness SERVING, readiness from etcd, and the threads that keep both and the stream
    sweep running until the server stops."""
    checker.set_liveness(LIVENESS_SERVICE)
    checker.check()  # the first answer already reflects etcd, not an optimistic default
    threading.Thread(target=checker.run, name="health-checker", daemon=True).start()
    threading.Thread(
        target=open_streams.run, args=(server,), name="stream-sweep", daemon=True
    ).start()


def _grpc_server(threads: int, interceptors: list[grpc.ServerInterceptor[Any, Any]]) -> grpc.Server:
    """A server with ``threads`` handler threads and as many calls at most.

    Streams never hold more than max_streams threads (OpenStreams), so max_workers are always
    left for unary calls. grpc refuses a call past the total RESOURCE_EXHAUSTED rather than
    queueing it in the pool, where it would wait unseen past its deadline. The pool starts
    threads as calls come: a long-lived call parks its thread on a lock (a waiting ClaimNext,
    a follower between events), which costs ~50 KB and no CPU (docs/operations.md has the
    measurements behind keeping the sync server).
    """
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
        interceptors=interceptors,
        maximum_concurrent_rpcs=threads,
        # grpc sets SO_REUSEPORT by default: a second replica on a taken port would then bind
        # silently and share its calls with whatever already listens there (maybe another
        # keyspace). Fail loudly instead.
        options=[("grpc.so_reuseport", 0)],
    )


@dataclass(frozen=True)
class _Chain:
    """The per-principal bounds build_server's caller sets on the interceptor chain."""

    calls_per_principal: int
    write_budgets: Mapping[Role, BudgetPolicy]
    high_water_shares: Mapping[Role, BudgetPolicy]
    refusals: RefusalLog | None


def _interceptors(
    store: Store, auth: AuthInterceptor, open_streams: OpenStreams, chain: _Chain
) -> list[grpc.ServerInterceptor[Any, Any]]:
    """The chain every call passes, outermost first, as one interceptor that builds each
    method's handler once (coordinator.server.interceptors.pipeline).

    Metrics run outermost, so auth and version-gate refusals are counted too. An undecodable
    body is refused next, before auth: it costs no token lookup and logs no traceback. Then
    auth: every later interceptor and servicer sees the caller. The stream bounds and the unary
    share count per principal, so they come right after auth (and before anything reads etcd).
    Idempotency keys are scoped to the authenticated principal, so they come after auth. The
    call log comes right after auth too: it names the principal and logs every later refusal.
    """
    metrics = store.ctx.metrics
    budgets = WriteBudgets(chain.write_budgets, metrics=metrics)
    stages: list[Stage] = [
        # Real methods only get labels: unknown ones pass by.
        RpcMetricsInterceptor(metrics),
        UndecodableInterceptor(),
        auth,
        CallLogInterceptor(SERVICE_NAMES, refusals=chain.refusals),
        StreamLimitInterceptor(open_streams, auth.check, refresh=auth.refresh),
        CallShareInterceptor(CallShares(chain.calls_per_principal, metrics)),
        VersionGateInterceptor(store.standing),  # minimum SDK; the replica's cached reading
        # Before idempotency: a keyed create within its caller's share stores its key too.
        HighWaterShareInterceptor(
            store.ctx.kv.space, WriteBudgets(chain.high_water_shares, metrics=metrics)
        ),
        # Charges a stored answer's bytes to the same budgets as the requests' below.
        IdempotencyInterceptor(store.idempotency, budgets, _input_of(store)),
        # Inside idempotency: a replay of a keyed create is answered, not charged again.
        WriteBudgetInterceptor(budgets),
        RequestIdInterceptor(),  # innermost: the handler's thread, for the event it writes
    ]
    return [Pipeline(stages)]


def _input_of(store: Store) -> Callable[[str], bytes]:
    """A task's input (a Claim's replay hands it out again)."""
    return lambda task_id: store.tasks.get(task_id).input


def _add_services(
    server: grpc.Server, store: Store, limits: StreamLimits, renew_rate: float
) -> health.HealthServicer:
    """The three servicers, health and reflection on ``server``; returns the health servicer."""
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(
        WorkerService(store, max_claim_wait=limits.max_claim_wait, renew_rate=renew_rate),
        server,
    )
    tasks_pb2_grpc.add_TaskServiceServicer_to_server(TaskService(store), server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminService(store), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return health_servicer


def _bind(
    server: grpc.Server, listen: str, tls: ServerTLS | None, health_listen: str | None
) -> int:
    """Bind the gRPC port (and the plaintext health port, if any); returns the bound port."""
    try:
        if tls is not None:
            port = server.add_secure_port(listen, tls.credentials())
        else:
            port = server.add_insecure_port(listen)
        if health_listen is not None:
            server.add_insecure_port(health_listen)
    except RuntimeError as exc:  # grpc raises a bare RuntimeError when it cannot bind
        raise ConfigError(bind_error(listen, exc)) from exc
    return port


def serve(config: Config, *, ready: Callable[[str], None] | None = None) -> int:
    """Run a replica until SIGTERM or SIGINT, then shut down gracefully; returns exit code 0.

    ``ready`` is called with the bound ``host:port`` once the server takes calls (``coordinator
    up`` prints it). Must run in the main thread, which owns signal handling.
    """
    configure_logging(config.log_level)
    lengthen_wait_slices()  # idle etcd watches of follow streams must not spin (grpc_waits.py)
    auth, tls = authenticator_for(config), tls_for(config)  # bad auth files fail before etcd
    ensure_free(config.listen, config.health_listen, config.metrics_listen)  # taken: exit 2
    stop, now = threading.Event(), threading.Event()
    with _signals_set(stop, now), _store_for(config, stop, tls) as store:
        if store is None:  # told to stop while waiting for etcd
            log.info("stopped")
            return 0
        server, port = build_server(
            store,
            listen=config.listen,
            max_workers=config.max_workers,
            calls_per_principal=config.max_calls_per_principal,
            renew_rate=config.renew_rate_per_principal,
            streams=config.stream_limits,
            health_interval=config.health_interval,
            auth=auth,
            tls=tls,
            health_listen=config.health_listen,
            write_budgets=config.write_budgets,
            high_water_share=config.write_budget_high_water_share,
        )
        try:  # after the gRPC bind, so a taken gRPC port is the error reported first
            metrics = start_metrics(
                store,
                config.metrics_listen,
                limits=HttpLimits(config.metrics_read_timeout, config.metrics_max_connections),
                tls=tls if config.metrics_tls else None,
            )
        except ConfigError:
            server.stop(0)
            raise
        address = f"{config.listen.rpartition(':')[0]}:{port}"
        log.info(
            "serving",
            listen=address,
            metrics=f"{config.metrics_listen.rpartition(':')[0]}:{metrics.port}",
            etcd=",".join(config.etcd),
            prefix=config.prefix,
            auth=auth_mode(config),
        )
        if ready is not None:
            ready(address)
        # A timed wait keeps the main thread responsive to signals on every platform.
        while not stop.wait(0.5):
            pass
        store.long_poll.stop_waiting()  # a task won now would reach a worker cut off
        _shut_down(server, config.shutdown_grace, now)
        metrics.close()
    log.info("stopped")
    return 0


def _shut_down(server: grpc.Server, grace: float, now: threading.Event) -> None:
    """Stop ``server``, its open calls given ``grace`` seconds, or none once ``now`` is set (a
    second signal)."""
    log.info("shutting down", grace=grace, sooner=SOONER)
    stopped = server.stop(grace)
    while not stopped.wait(0.2):
        if now.is_set():
            log.info("stopping now: open calls cancelled")
            server.stop(None)
            return


SOONER = "a second SIGINT or SIGTERM cancels the calls still open now"
"""What the shutdown's log line says to an operator waiting on a follow stream's grace."""


@contextmanager
def _store_for(
    config: Config, stop: threading.Event, tls: ServerTLS | None
) -> Iterator[Store | None]:
    """Connect to etcd and start the store, waiting for etcd to answer (startup.py); close
    both on the way out. None if told to stop while waiting."""
    opened = wait_for_store(
        lambda: _open_store(config),
        etcd=config.etcd,
        stop=stop,
        listen=config.listen,
        tls=tls,
        health_listen=config.health_listen,
        liveness=LIVENESS_SERVICE,
        readiness=("", *SERVICE_NAMES),
    )
    if opened is None:
        yield None
        return
    kv, store = opened
    db_size = DbSizeWatch(
        kv,
        quota_bytes=config.etcd_quota_bytes,
        warn_ratio=config.etcd_quota_warn_ratio,
        high_water=config.etcd_quota_high_water,
        full=config.etcd_quota_full,
        interval=config.etcd_space_interval,
        trim=HistoryTrim(kv, keep=config.etcd_compact_keep, metrics=store.ctx.metrics),
        metrics=store.ctx.metrics,
    )
    db_size.start()
    if not config.retention:
        log.warning("retention is 0: finished tasks are kept forever and etcd fills up")
    try:
        yield store
    finally:
        db_size.close()
        store.close()
        kv.close()


def _open_store(config: Config) -> tuple[EtcdKV, Store]:
    """A connection and a started store; StoreUnavailable (nothing left open) while etcd does
    not answer."""
    kv = EtcdKV.connect(list(config.etcd), timeout=config.etcd_timeout, **config.etcd_security())
    # Refused writers are told to come back after the next reading of etcd's space.
    kv.space = SpaceGuard(retry_after=config.etcd_space_interval)
    try:
        store = Store.open(
            kv,
            keys=Keyspace(config.prefix),
            limits=config.limits,
            scan_interval=config.reclaim_scan_interval,
            idempotency_ttl=config.idempotency_ttl,
            retention=config.retention_policy,
            archive=open_sink(config.archive),
            prune_interval=config.prune_interval,
            prune_rate=config.prune_rate,
            promote_interval=config.promote_interval,
            max_claim_waiters=config.max_claim_waiters,
            max_replays=config.max_replays,
            max_replays_per_principal=config.max_replays_per_principal,
        )
        refuse_old_coordinator(VersionStore(store.ctx))  # before anything runs or writes
        store.start()
    except BaseException:
        kv.close()
        raise
    return kv, store


@contextmanager
def _signals_set(stop: threading.Event, now: threading.Event) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``stop`` for the duration, and a second one to ``now`` (the
    grace cut short); restore the old handlers."""

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("signal received", signal=signal.Signals(signum).name)
        (now if stop.is_set() else stop).set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
