"""The client's keepalive loop (sdk/_renewer.py): one loop renews every claim of a client, the
claims due together in one RenewMany; a coordinator without RenewMany is renewed claim by
claim. Real coordinator, real etcd."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, ClaimRefused
from tests.helpers import eventually
from tests.sdk.support import QUEUE, CallCounter, Served, served

TTL = timedelta(seconds=3)  # a renewal every second


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Any:
    with served(etcd.endpoint, prefix) as running:
        yield running


def _hold(coordinator: Served, count: int, stack: ExitStack, **client: Any) -> list[Claim]:
    with coordinator.client("producer") as producer:
        for n in range(count):
            producer.create_task(f"t{n:04d}", input=b"x", queue=QUEUE)
    holder = stack.enter_context(coordinator.client("holder", **client))
    claims = []
    for _ in range(count):
        claim = holder.claim_next(QUEUE, ttl=TTL)
        assert not isinstance(claim, ClaimRefused), claim
        claims.append(stack.enter_context(claim))
    return claims


@pytest.mark.slow
def test_a_client_holding_1000_claims_renews_them_from_one_loop_in_few_calls(
    coordinator: Served,
) -> None:
    counter = CallCounter()
    with ExitStack() as stack:
        claims = _hold(coordinator, 1000, stack, interceptors=[counter])
        start = sum(c.renewals for c in claims)
        calls_before = counter.calls.get("RenewMany", 0)
        eventually(lambda: min(c.renewals for c in claims) >= 3, timeout=30, message="renewals lag")
        renewals = sum(c.renewals for c in claims) - start
        calls = counter.calls.get("RenewMany", 0) - calls_before
        assert not [c for c in claims if c.is_lost()]
        loops = [t for t in threading.enumerate() if t.name == "keepalive"]
        assert len(loops) == 1  # one loop for the client, not a thread per claim
    assert counter.calls.get("Renew", 0) == 0
    # Claims due within a tenth of their interval share a call (at most 500 a call), so the
    # loop's calls fall into a few phases per interval: a call renews dozens of claims.
    assert renewals >= 2000
    assert renewals / calls >= 20, (renewals, calls)


class _Unimplemented(grpc.RpcError):
    """A failed call as gRPC hands it to the caller (``result()`` raises it)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return "Method not found!"

    def result(self) -> None:
        raise self


class _WithoutRenewMany(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """What a coordinator older than RenewMany answers it."""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method.endswith("/RenewMany"):
            return _Unimplemented()
        return continuation(details, request)


def test_a_coordinator_without_renew_many_is_renewed_claim_by_claim(coordinator: Served) -> None:
    counter = CallCounter()
    with ExitStack() as stack:
        claims = _hold(coordinator, 3, stack, interceptors=[counter, _WithoutRenewMany()])
        eventually(lambda: min(c.renewals for c in claims) >= 2, timeout=15)
        assert not [c for c in claims if c.is_lost()]
    assert counter.calls.get("RenewMany") == 1  # asked once, then never again
    assert counter.calls.get("Renew", 0) >= 6
