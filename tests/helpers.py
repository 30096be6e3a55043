"""Test helpers shared across the suite. Waits poll with a deadline; tests never sleep blindly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.message import Message

from coordinator.domain.effect_ids import effect_id
from coordinator.domain.keys import Keyspace
from coordinator.domain.retry import RetryDefaults, RetryPolicy

T = TypeVar("T")

RETRY_AT_ONCE = RetryDefaults(RetryPolicy(initial_backoff=0.0))
"""Retry defaults for servers in tests about claims, fences and reclaims rather than retry
timing: an ended attempt's task is claimable again at once. The server's real default (1 s
doubling, with jitter) is what tests/domain/test_retry.py and tests/workqueue/ exercise."""

Probe = Callable[[], tuple[int, int]]
"""A probe of a test's keyspace: (number of keys, highest mod_revision) under its prefix (the
``keyspace`` fixture)."""

Metadata = Sequence[tuple[str, str]]


def eventually(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition did not become true",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that value (never
    None: a predicate may answer None for "not yet").

    An AssertionError raised by the predicate counts as "not yet", so a block of asserts can be
    polled too. On the deadline the test fails with ``message`` and the last value or assertion.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except AssertionError as exc:
            last = f"last assertion: {exc}"
        else:
            if result:
                return result
            last = f"last value {result!r}"
        if time.monotonic() >= deadline:
            pytest.fail(f"{message} (not within {timeout}s; {last})")
        time.sleep(interval)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def refused(
    call: Callable[..., Any],
    request: Message,
    code: grpc.StatusCode,
    named: str,
    probe: Probe,
    *,
    metadata: Metadata = (),
) -> None:
    """``call(request)`` fails with ``code``, its message contains ``named`` (the field, or
    what is wrong), and the keyspace ``probe`` reads is unchanged: bad input writes nothing."""
    before = probe()
    with pytest.raises(grpc.RpcError) as info:
        call(request, metadata=metadata)
    assert info.value.code() == code, info.value.details()
    assert named in str(info.value.details())
    assert probe() == before


def resumes_at(token: str) -> str:
    """The position a page token resumes at: the part before its check (a token is
    ``<position>~<check>``, coordinator/server/wire/page_tokens.py)."""
    return token.partition("~")[0]


def as_unary(fake: Callable[..., Any]) -> Any:
    """``fake`` where a gRPC unary method is expected (``Rpc.call``): a test double that
    takes ``(request, *, timeout, metadata)`` like a real multi-callable."""
    return fake


def next_of(call: grpc.CallIterator[T]) -> T:
    """The next response of a response-streaming call (the typing stubs make a call only
    iterable; it is its own iterator)."""
    return next(iter(call))


def cancel(call: grpc.Call) -> None:
    """Cancel ``call`` (the typing stubs leave ``cancel`` untyped)."""
    call.cancel()  # type: ignore[no-untyped-call]


def slot_effect_id(
    etcd_client: Any, prefix: str, task_id: str, node_id: str, effect_slot: str, revision: int = 1
) -> str:
    """The effect id the coordinator gives a slot of ``task_id`` (a task created by this
    release, so its incarnation, the task key's create_revision, is in the id)."""
    _, meta = etcd_client.get(Keyspace(prefix).task(task_id))
    assert meta is not None, f"task {task_id!r} does not exist"
    return effect_id(task_id, meta.create_revision, revision, node_id, effect_slot)


class InProcessCaller:
    """A ``coordinator.store.Caller`` for calls made in the test's own process: there until
    ``leave()``, which runs the end-of-call callbacks as gRPC would."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] | None = []

    def alive(self) -> bool:
        """Whether ``leave`` was not called yet."""
        with self._lock:
            return self._callbacks is not None

    def on_end(self, callback: Callable[[], None]) -> bool:
        """Keep ``callback`` for ``leave``; False once it was called."""
        with self._lock:
            if self._callbacks is None:
                return False
            self._callbacks.append(callback)
            return True

    def confirm(self) -> None:
        """In-process calls carry no credentials to revoke."""

    def answer_lost(self) -> bool:
        """An in-process call's answer always arrives."""
        return False

    def replayable(self) -> bool:
        """No idempotency key."""
        return False

    def leave(self) -> None:
        """The call ends: every callback runs, once."""
        with self._lock:
            callbacks, self._callbacks = self._callbacks or [], None
        for callback in callbacks:
            callback()
