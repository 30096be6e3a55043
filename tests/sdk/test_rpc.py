"""Rpc.call without a server: tries, backoff and error mapping against a scripted method.

The first try of a call runs outside the retry machinery; these tests pin down that it still
counts as the first of the policy's attempts, for the number of tries and for the backoff.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import tenacity

from coordinator import __version__, request_ids
from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.errors import NotFound, PermissionDenied
from coordinator.sdk import PRINCIPAL_METADATA, RetryPolicy, TransportError
from coordinator.sdk._rpc import SDK_VERSION_METADATA, Rpc

POLICY = RetryPolicy(
    timeout=timedelta(seconds=3),
    attempts=4,
    initial_backoff=timedelta(milliseconds=100),
    max_backoff=timedelta(milliseconds=250),
)


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__()
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "scripted"


class Scripted:
    """A unary method that raises the scripted codes in turn, then answers "ok"."""

    def __init__(self, *codes: grpc.StatusCode) -> None:
        self._codes = list(codes)
        self.tries: list[tuple[float, tuple[tuple[str, str], ...]]] = []

    def __call__(self, request: Any, *, timeout: float, metadata: Any) -> str:
        self.tries.append((timeout, metadata))
        if self._codes:
            raise _Failed(self._codes.pop(0))
        return "ok"


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff sleeps of the retries, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(tenacity.nap, "time", SimpleNamespace(sleep=slept.append))
    return slept


@pytest.fixture
def rpc() -> Iterator[Rpc]:
    """An Rpc with POLICY; its channel is never used."""
    channel = Rpc("127.0.0.1:1", principal="w1", retry=POLICY)
    try:
        yield channel
    finally:
        channel.close()


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_transport_failures_are_retried_with_backoff_from_the_first_try(
    rpc: Rpc, sleeps: list[float]
) -> None:
    method = Scripted(UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, UNAVAILABLE)
    assert rpc.call(method, None, idempotency_key="k1") == "ok"
    assert len(method.tries) == 4
    # initial, 2x, then capped at max_backoff; each plus up to one initial of jitter.
    assert len(sleeps) == 3
    for slept, base in zip(sleeps, (0.1, 0.2, 0.25), strict=True):
        assert base <= slept <= base + 0.1
    # Every try is the same call: same deadline, principal, version, request id and key.
    assert len(set(method.tries)) == 1
    timeout, metadata = method.tries[0]
    sent = dict(metadata)
    assert timeout == 3.0
    assert sent[PRINCIPAL_METADATA] == "w1" and sent[SDK_VERSION_METADATA] == __version__
    assert request_ids.is_valid(sent[request_ids.METADATA_KEY])
    assert sent[IDEMPOTENCY_METADATA_KEY] == "k1"


def test_tries_stop_at_the_policys_attempts(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(*[UNAVAILABLE] * 10)
    with pytest.raises(TransportError) as raised:
        rpc.call(method, None)
    assert raised.value.code == "UNAVAILABLE"
    assert isinstance(raised.value.__cause__, _Failed)
    assert (len(method.tries), len(sleeps)) == (4, 3)


def test_without_retry_a_transport_failure_is_final(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE)
    with pytest.raises(TransportError):
        rpc.call(method, None, retry=False, timeout=0.5)
    assert method.tries[0][0] == 0.5
    assert (len(method.tries), sleeps) == (1, [])


def test_one_attempt_means_no_retry(sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE)
    once = Rpc("127.0.0.1:1", principal="w1", retry=RetryPolicy(attempts=1))
    try:
        with pytest.raises(TransportError):
            once.call(method, None)
    finally:
        once.close()
    assert (len(method.tries), sleeps) == (1, [])


def test_other_errors_are_mapped_and_never_retried(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(grpc.StatusCode.NOT_FOUND)
    with pytest.raises(NotFound, match="NOT_FOUND: scripted"):
        rpc.call(method, None)
    assert (len(method.tries), sleeps) == (1, [])


def test_a_retry_answered_with_another_error_is_final(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(PermissionDenied, match="PERMISSION_DENIED: scripted"):
        rpc.call(method, None)
    assert (len(method.tries), len(sleeps)) == (2, 1)
