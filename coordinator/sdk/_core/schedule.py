"""The keepalive schedule of one client, shared by the sync and the asyncio loop: which claims
are due, in which RenewMany calls, and what each answer does to them. Pure (no channel, no
thread, no event loop): sdk/_renewer.py runs it on a thread, sdk/aio/_renewer.py on the loop.

Each claim keeps its own schedule (TTL/3 after its last renewal was sent, sooner after a
failure: sdk/_core/held.py); every claim due within a tenth of its interval goes with the
current call (a renewal a little early costs nothing: the TTL is restored from its send), in
calls of at most MAX_BATCH claims and MAX_BYTES of requests, whose deadline is the longest
lease left among its claims (past it every one of them is lost by the local clock).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Protocol

import structlog

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.calls import CallRetry
from coordinator.sdk._status import error_of
from coordinator.v1 import worker_pb2

log = structlog.get_logger("coordinator.sdk.claim")

MAX_BATCH = 500
"""Claims per RenewMany (the server takes up to 1000)."""
MAX_BYTES = 1 << 20
"""Request bytes per RenewMany (checkpoints make renewals up to 64 KiB each)."""
EARLY = 0.1
"""A claim due within this fraction of its renewal interval goes with the current call."""


class Renewable(Protocol):
    """What the loop needs of a held claim (sdk/_core/held.py implements it)."""

    def keepalive_wanted(self) -> bool:
        """False once the claim ended, was lost or was closed: the loop drops it."""

    def renewal_request(self, policy: CallRetry) -> tuple[worker_pb2.RenewRequest, float]:
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


Due = tuple[Renewable, worker_pb2.RenewRequest, float]
"""A claim due for renewal, its request, and how long that request may take."""
Answer = worker_pb2.RenewResponse | CoordinatorError
"""A renewal's answer, or what failed it."""


class Schedule:
    """When each claim of a client is due, oldest first (not thread-safe: the loop guards it)."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Renewable]] = []  # a heap of (when, order, claim)
        self._order = itertools.count()
        self.batched = True  # until the coordinator answers UNIMPLEMENTED

    def add(self, claim: Renewable, when: float) -> None:
        """Renew ``claim`` at ``when`` (monotonic seconds)."""
        heapq.heappush(self._due, (when, next(self._order), claim))

    def next_due(self) -> float | None:
        """When the first wanted claim is due (claims no longer wanted are dropped)."""
        while self._due and not self._due[0][2].keepalive_wanted():
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def take(self, now: float, policy: CallRetry) -> list[list[Due]]:
        """Every wanted claim due within EARLY of its interval, with its request, in calls."""
        taken: list[Due] = []
        kept: list[tuple[float, int, Renewable]] = []
        for entry in self._due:
            when, _, claim = entry
            if not claim.keepalive_wanted():
                continue
            if when <= now + EARLY * claim.renewal_interval():
                request, timeout = claim.renewal_request(policy)
                taken.append((claim, request, timeout))
            else:
                kept.append(entry)
        heapq.heapify(kept)
        self._due = kept
        return list(_batches(taken))

    def wanted(self) -> int:
        """How many claims are kept alive."""
        return sum(1 for _, _, claim in self._due if claim.keepalive_wanted())

    def call(self, batch: list[Due]) -> tuple[worker_pb2.RenewManyRequest, float]:
        """The RenewMany for ``batch`` and its deadline (the longest lease left in it)."""
        request = worker_pb2.RenewManyRequest(renewals=[r for _, r, _ in batch])
        return request, max(t for _, _, t in batch)

    def again(self, renewed: list[tuple[Renewable, float]]) -> None:
        """Schedule the next renewal of each claim that still wants one."""
        for claim, when in renewed:
            if claim.keepalive_wanted():
                self.add(claim, when)


def apply(
    batch: list[Due], answers: Sequence[Answer], sent: float
) -> list[tuple[Renewable, float]]:
    """Hand each claim its answer (which may report a loss: call it with no lock held); each
    claim with when to renew it next."""
    renewed: list[tuple[Renewable, float]] = []
    for (claim, request, _), answer in zip(batch, answers, strict=True):
        if isinstance(answer, CoordinatorError):
            claim.renewal_failed(answer)
            accepted = False
        else:
            accepted = claim.renewed(sent, answer, request)
        renewed.append((claim, claim.next_renewal(sent, accepted)))
    return renewed


def answers_of(response: worker_pb2.RenewManyResponse) -> list[Answer]:
    """Each item's RenewResponse, or its error as the exception a lone Renew would raise."""
    out: list[Answer] = []
    for result in response.results:
        if result.HasField("error"):
            out.append(error_of(result.error.code, result.error.message))
        else:
            renewal: worker_pb2.RenewResponse = result.renewal
            out.append(renewal)
    return out


def crashed(batch: list[Due], exc: Exception) -> None:
    """A bug in the loop: no claim of ``batch`` may look held with nobody renewing it."""
    log.exception("keepalive loop failed")
    for claim, _, _ in batch:
        claim.keepalive_crashed(exc)


def _batches(due: list[Due]) -> Iterator[list[Due]]:
    """``due`` in calls of at most MAX_BATCH claims and MAX_BYTES."""
    current: list[Due] = []
    size = 0
    for entry in due:
        nbytes = entry[1].ByteSize()
        if current and (len(current) >= MAX_BATCH or size + nbytes > MAX_BYTES):
            yield current
            current, size = [], 0
        current.append(entry)
        size += nbytes
    if current:
        yield current
