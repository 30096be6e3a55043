"""One keepalive loop for every claim of a client: renewals that fall due together go to the
coordinator in one RenewMany call.

Each claim keeps its own schedule, as a lone keepalive would (TTL/3 after its last renewal was
sent, sooner after a failure: sdk/_held.py), and gets its own answer, so loss detection stays per
claim. The loop sleeps until the first renewal is due, then renews every claim due within a
tenth of its interval (a renewal a little early costs nothing: the TTL is restored from its
send), in calls of at most MAX_BATCH claims and MAX_BYTES of requests. A call's deadline is the
longest lease left among its claims (past it every one of them is lost by the local clock), and
a coordinator that cannot be reached loses a claim only once its own lease ran out by the local
clock, as before. A coordinator that has no RenewMany
(UNIMPLEMENTED: an older version) is renewed one Renew per claim, from the same loop.

Measured (``python -m bench``, phase ``held``): what 10,000 held claims cost the client, the
coordinator and etcd.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from coordinator.errors import CoordinatorError
from coordinator.sdk._rpc import RetryPolicy, Rpc, error_of
from coordinator.sdk.types import NotSupported
from coordinator.v1 import worker_pb2

log = structlog.get_logger("coordinator.sdk.claim")

MAX_BATCH = 500
"""Claims per RenewMany (the server takes up to 1000)."""
MAX_BYTES = 1 << 20
"""Request bytes per RenewMany (checkpoints make renewals up to 64 KiB each)."""
EARLY = 0.1
"""A claim due within this fraction of its renewal interval goes with the current call."""


class Renewable(Protocol):
    """What the loop needs of a held claim (sdk/_held.py implements it)."""

    def keepalive_wanted(self) -> bool:
        """False once the claim ended, was lost or was closed: the loop drops it."""

    def renewal_request(self, policy: RetryPolicy) -> tuple[worker_pb2.RenewRequest, float]:
        """The next renewal and the longest it may take (the lease left)."""

    def renewed(
        self, sent: float, response: worker_pb2.RenewResponse, request: worker_pb2.RenewRequest
    ) -> bool:
        """Apply an answer; True if the renewal was accepted."""

    def renewal_failed(self, exc: CoordinatorError) -> None:
        """A renewal raised ``exc``."""

    def next_renewal(self, sent: float, accepted: bool) -> float:
        """When to renew next."""

    def renewal_interval(self) -> float:
        """Seconds between renewals when they are accepted."""

    def keepalive_crashed(self, exc: Exception) -> None:
        """The loop failed on this claim: it must not look held."""


class Renewer:
    """The keepalive loop of one client (see the module docstring). Its thread starts with the
    first claim and stops with ``close``."""

    def __init__(self, rpc: Rpc, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rpc = rpc
        self._clock = clock
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Renewable]] = []  # a heap of (when, order, claim)
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._batched = True  # until the coordinator answers UNIMPLEMENTED

    def add(self, claim: Renewable) -> None:
        """Keep ``claim`` alive from now on (its first renewal at TTL/3 from now)."""
        with self._cond:
            if self._closed:
                raise CoordinatorError("the client is closed: its claims are not renewed")
            when = claim.next_renewal(self._clock(), True)
            heapq.heappush(self._due, (when, next(self._order), claim))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="keepalive", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Stop the loop (claims still held are no longer renewed: their leases run out)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._rpc.policy.timeout.total_seconds())

    def __len__(self) -> int:
        with self._cond:
            return sum(1 for _, _, claim in self._due if claim.keepalive_wanted())

    # --- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            due = self._wait_for_due()
            if due is None:
                return
            for batch in _batches(due):
                self._renew(batch)

    def _wait_for_due(self) -> list[tuple[Renewable, worker_pb2.RenewRequest, float]] | None:
        """Sleep until a renewal is due; every claim due by then with its request, or None once
        closed."""
        with self._cond:
            while not self._closed:
                while self._due and not self._due[0][2].keepalive_wanted():
                    heapq.heappop(self._due)
                now = self._clock()
                if self._due and self._due[0][0] <= now:
                    return self._take(now)
                self._cond.wait(self._due[0][0] - now if self._due else None)
            return None

    def _take(self, now: float) -> list[tuple[Renewable, worker_pb2.RenewRequest, float]]:
        """Pop every wanted claim due within EARLY of its interval (called with the lock)."""
        taken: list[tuple[Renewable, worker_pb2.RenewRequest, float]] = []
        kept: list[tuple[float, int, Renewable]] = []
        for entry in self._due:
            when, _, claim = entry
            if not claim.keepalive_wanted():
                continue
            if when <= now + EARLY * claim.renewal_interval():
                request, timeout = claim.renewal_request(self._rpc.policy)
                taken.append((claim, request, timeout))
            else:
                kept.append(entry)
        heapq.heapify(kept)
        self._due = kept
        return taken

    def _renew(self, batch: list[tuple[Renewable, worker_pb2.RenewRequest, float]]) -> None:
        sent = self._clock()
        try:
            answers = self._send(batch)
            for (claim, request, _), answer in zip(batch, answers, strict=True):
                if isinstance(answer, CoordinatorError):
                    claim.renewal_failed(answer)
                    accepted = False
                else:
                    accepted = claim.renewed(sent, answer, request)
                self._again(claim, sent, accepted)
        except Exception as exc:  # a bug: no claim may look held with nobody renewing it
            log.exception("keepalive loop failed")
            for claim, _, _ in batch:
                claim.keepalive_crashed(exc)

    def _send(
        self, batch: list[tuple[Renewable, worker_pb2.RenewRequest, float]]
    ) -> Sequence[worker_pb2.RenewResponse | CoordinatorError]:
        """One answer per claim of ``batch``: its RenewResponse, or the error that failed it."""
        # Never past the longest lease left in the batch: by then every claim in it is lost by
        # the local clock anyway; a claim nearer its end is judged by its own clock meanwhile.
        timeout = max(t for _, _, t in batch)
        if self._batched:
            request = worker_pb2.RenewManyRequest(renewals=[r for _, r, _ in batch])
            try:
                # No SDK retries: this loop is the retry, and each try ends before the lease.
                response = self._rpc.call(
                    self._rpc.worker.RenewMany, request, retry=False, timeout=timeout
                )
            except NotSupported:
                self._batched = False  # an older coordinator: one Renew per claim from now on
            except CoordinatorError as exc:
                return [exc] * len(batch)
            else:
                return [_item(result) for result in response.results]
        return [self._lone(request, t) for _, request, t in batch]

    def _lone(
        self, request: worker_pb2.RenewRequest, timeout: float
    ) -> worker_pb2.RenewResponse | CoordinatorError:
        try:
            return self._rpc.call(self._rpc.worker.Renew, request, retry=False, timeout=timeout)
        except CoordinatorError as exc:
            return exc

    def _again(self, claim: Renewable, sent: float, accepted: bool) -> None:
        with self._cond:
            if claim.keepalive_wanted() and not self._closed:
                when = claim.next_renewal(sent, accepted)
                heapq.heappush(self._due, (when, next(self._order), claim))


def _item(result: worker_pb2.RenewManyResult) -> worker_pb2.RenewResponse | CoordinatorError:
    if result.HasField("error"):
        return error_of(result.error.code, result.error.message)
    renewal: worker_pb2.RenewResponse = result.renewal
    return renewal


def _batches(
    due: list[tuple[Renewable, worker_pb2.RenewRequest, float]],
) -> list[list[tuple[Renewable, worker_pb2.RenewRequest, float]]]:
    """``due`` in calls of at most MAX_BATCH claims and MAX_BYTES."""
    batches: list[list[tuple[Renewable, worker_pb2.RenewRequest, float]]] = []
    current: list[tuple[Renewable, worker_pb2.RenewRequest, float]] = []
    size = 0
    for entry in due:
        nbytes = entry[1].ByteSize()
        if current and (len(current) >= MAX_BATCH or size + nbytes > MAX_BYTES):
            batches.append(current)
            current, size = [], 0
        current.append(entry)
        size += nbytes
    if current:
        batches.append(current)
    return batches
