"""Abort: ends the calls made with it at once, from any thread (a stopping pool's long polls).

    abort = Abort()
    claim = client.claim_next("q", ttl=ttl, wait=timedelta(seconds=10), abort=abort)
    ...                                        # on another thread: abort.abort()

A call in flight is cancelled on the wire, so the coordinator ends its wait too and claims
nothing for it, and a claim it made while the caller was leaving is given back at once,
uncounted (store/claims/long_poll.py, store/attempts/give_back.py). A call whose answer was already
on its way back when ``abort()`` came still claimed: the answer is dropped, and that claim waits out
its lease. That window is the answer's trip back, never the wait: a pool stopped while it long-polls
claims nothing; one stopped just as a claim is answered may leave that one task CLAIMED until
its TTL, as a crash would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from coordinator.errors import CoordinatorError


class CallAborted(CoordinatorError):
    """The call was ended by ``Abort.abort()`` before it was answered."""


class Abort:
    """Cancels every call made with it that is in flight, and every later one, once
    ``abort()`` was called. Thread-safe; one-way (no reset)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = threading.Event()  # set under the lock: ``watching`` reads it there
        self._calls: set[grpc.Future[Any]] = set()

    def aborted(self) -> bool:
        """Whether ``abort()`` was called."""
        return self._aborted.is_set()

    def abort(self) -> None:
        """Cancel the calls in flight; later calls made with this Abort raise CallAborted."""
        with self._lock:
            self._aborted.set()
            calls = list(self._calls)
        for call in calls:
            call.cancel()

    def sleep(self, seconds: float) -> None:
        """Sleep between a call's tries, woken by ``abort()``: the next try is then refused
        unsent. A stopping pool whose poll met no coordinator slept out its retry backoff."""
        self._aborted.wait(seconds)

    @contextmanager
    def watching(self, call: grpc.Future[Any]) -> Iterator[None]:
        """Cancel ``call`` if ``abort()`` is (or was already) called while in the block."""
        with self._lock:
            self._calls.add(call)
            aborted = self._aborted.is_set()
        if aborted:
            call.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._calls.discard(call)
