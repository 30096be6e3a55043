"""Helpers for the SDK tests: a real coordinator (store + gRPC server) on the session etcd."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.effect_ids import effect_id_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.roles import Role
from coordinator.domain.write_budget import BudgetPolicy
from coordinator.metrics import Metrics
from coordinator.sdk import CallRetry, WorkerClient
from coordinator.server import build_server
from coordinator.store import EtcdKV, Store, TaskSpec
from tests.conftest import GRPC_OPTIONS
from tests.helpers import RETRY_AT_ONCE

# Short limits: etcd itself raises TTLs below ~2 s, so a 1 s claim is granted 2 s.
LIMITS = ClaimLimits(
    min_ttl=1, max_ttl=30, max_claim_duration=600.0, stall_timeout=300.0, retry=RETRY_AT_ONCE
)
QUEUE = "q"


@dataclass
class Served:
    """A running coordinator: its address, server and store."""

    target: str
    server: grpc.Server
    store: Store

    def client(self, principal: str, **kwargs: Any) -> WorkerClient:
        """A client of this coordinator (no proxy: it is on loopback)."""
        kwargs.setdefault("retry", CallRetry(attempts=3))
        return WorkerClient(
            self.target, principal=principal, channel_options=GRPC_OPTIONS, **kwargs
        )

    def effect_id(self, task_id: str, node_id: str, effect_slot: str, revision: int = 1) -> str:
        """The id this coordinator gives a slot of ``task_id`` (it names the task's
        incarnation, so it is known once the task exists)."""
        return effect_id_of(self.store.tasks.get(task_id), revision, node_id, effect_slot)


@contextmanager
def served(
    endpoint: str,
    prefix: str,
    *,
    listen: str = "127.0.0.1:0",
    metrics: Metrics | None = None,
    write_budgets: Mapping[Role, BudgetPolicy] | None = None,
) -> Iterator[Served]:
    """Start a store on ``prefix`` (counting on ``metrics``, else the process's) and a server
    for it (with ``write_budgets`` per role, if given); stop both on exit."""
    kv = EtcdKV.connect([endpoint])
    store = Store.open(kv, keys=Keyspace(prefix), limits=LIMITS, scan_interval=1.0, metrics=metrics)
    store.start()
    server, port = build_server(store, listen=listen, write_budgets=write_budgets)
    try:
        yield Served(f"127.0.0.1:{port}", server, store)
    finally:
        server.stop(0)
        store.close()
        kv.close()


@contextmanager
def served_with_task(
    endpoint: str, prefix: str, *, write_budgets: Mapping[Role, BudgetPolicy] | None = None
) -> Iterator[Served]:
    """``served``, with one READY task "t1" (input ``b"input"``) in QUEUE, created on the
    store itself: a test's tight write budgets are for the calls it makes."""
    with served(endpoint, prefix, write_budgets=write_budgets) as running:
        running.store.tasks.create(
            TaskSpec(task_id="t1", queue=QUEUE, input=b"input"), by="producer"
        )
        yield running


class CallCounter(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Counts the tries of every unary call by method name (each retry is one more)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        name = details.method.rsplit("/", 1)[-1]
        self.calls[name] = self.calls.get(name, 0) + 1
        return continuation(details, request)
