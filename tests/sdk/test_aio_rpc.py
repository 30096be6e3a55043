"""AsyncRpc.call without a server: the sync transport's plan of a call, awaited.

The scripted method of test_rpc.py, wrapped in a coroutine: the same tries, the same request id
on every one, and the same error for a call given up (OutcomeUnknown if a try may have landed,
TransportError if none did), with tenacity's AsyncRetrying sleeping between them.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator import request_ids
from coordinator.sdk import CallRetry, OutcomeUnknown, TransportError
from coordinator.sdk._status import NO_COORDINATOR_HINT
from coordinator.sdk.aio._rpc import AsyncRpc
from tests.helpers import as_unary
from tests.sdk.test_rpc import NOT_SENT, Scripted, _Failed

QUICK = CallRetry(
    timeout=timedelta(seconds=3),
    attempts=4,
    initial_backoff=timedelta(milliseconds=1),
    max_backoff=timedelta(milliseconds=2),
)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def call(method: Scripted, **kwargs: Any) -> Any:
    """``AsyncRpc.call`` of ``method`` (as a coroutine) on a fresh loop."""

    async def awaitable(request: Any, *, timeout: float, metadata: Any) -> Any:
        return method(request, timeout=timeout, metadata=metadata)

    async def run() -> Any:
        rpc = AsyncRpc("127.0.0.1:1", principal="w1", retry=QUICK)
        try:
            return await rpc.call(as_unary(awaitable), None, **kwargs)
        finally:
            await rpc.close()

    return asyncio.run(run())


def test_transport_failures_are_retried_as_one_call() -> None:
    method = Scripted(UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, UNAVAILABLE)
    assert call(method) == "ok"
    assert len(method.tries) == 4
    assert len(set(method.tries)) == 1  # same deadline, principal, version and request id
    assert request_ids.is_valid(dict(method.tries[0][1])[request_ids.METADATA_KEY])


def test_a_call_given_up_after_a_try_that_may_have_landed_is_an_unknown_outcome() -> None:
    method = Scripted(*[UNAVAILABLE] * 4)
    with pytest.raises(OutcomeUnknown, match="outcome unknown, not failed"):
        call(method, lease_left=timedelta(seconds=30))
    assert len(method.tries) == 4


def test_a_call_no_try_of_which_left_is_a_plain_transport_error() -> None:
    method = Scripted(*[_Failed(UNAVAILABLE, NOT_SENT)] * 4)
    with pytest.raises(TransportError) as raised:
        call(method)
    assert type(raised.value) is TransportError
    assert str(raised.value).endswith("no try reached a coordinator" + NO_COORDINATOR_HINT)
