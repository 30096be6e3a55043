"""What the SDK's helpers need of a held claim, as a Protocol: its fence, calls behind it, and
marking it lost.

Effects (sdk/effects.py) and managed jobs (sdk/managed.py) work on a ``HeldAttempt``, not on
the claim class itself, so they neither import it (no import circle) nor reach into its private
parts; the claim (sdk/claim.py ``Claim``) implements it. State that belongs to one attempt, such as
the effect keys it sent, lives on the attempt, never in a module-level map.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeAlias

import grpc

from coordinator.domain.decisions import Fence
from coordinator.domain.states import FenceReason, Outcome
from coordinator.sdk._core.calls import Req, Resp
from coordinator.sdk._duration import Duration
from coordinator.sdk.types import LossSource
from coordinator.v1 import worker_pb2_grpc

# A string: grpc's multicallable is generic only in its type stubs, not at runtime.
WorkerMethod: TypeAlias = (
    "Callable[[worker_pb2_grpc.WorkerServiceStub], grpc.UnaryUnaryMultiCallable[Req, Resp]]"
)
"""Picks the WorkerService method to call, e.g. ``lambda worker: worker.PrepareEffect``."""


class SentKeys:
    """The effect keys one attempt sent downstream. The SDK never sends a key twice within an
    attempt, even if the coordinator answers EXECUTE again (a retried prepare whose first answer
    was lost): the second time it looks the key up instead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[str] = set()

    def first_send(self, key: str) -> bool:
        """Record that ``key`` is about to be sent; False if it was sent before (so two calls of
        one attempt racing on a key send it once)."""
        with self._lock:
            if key in self._keys:
                return False
            self._keys.add(key)
            return True


class FencedAttempt(Protocol):
    """What the effect protocol (sdk/effects.py) needs of an attempt besides its transport:
    the sync Claim and the asyncio AsyncClaim both are one."""

    @property
    def fence(self) -> Fence:
        """The credential every call behind the claim carries."""
        ...

    @property
    def sent_keys(self) -> SentKeys:
        """The effect keys this attempt sent."""
        ...

    def mark_lost(
        self, outcome: Outcome, reason: FenceReason, message: str, source: LossSource
    ) -> None:
        """The coordinator refused a call behind the fence: the attempt is lost (reported
        once)."""
        ...


class HeldAttempt(FencedAttempt, Protocol):
    """One attempt holding a claim, as effects and managed jobs use it."""

    def call(self, method: WorkerMethod[Req, Resp], request: Req) -> Resp:
        """Call a WorkerService method whose request carries ``fence``; its retries stop when
        the lease runs out."""
        ...

    def check(self, *, margin: Duration | None = None) -> None:
        """Raise ClaimLost unless the attempt is held with more than ``margin`` of lease left."""
        ...
