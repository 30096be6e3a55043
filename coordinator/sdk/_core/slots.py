"""A pool's slots, written once: how many are free, which claims run in them, who hears a loss
of a claim one ClaimNext won, and where a finished claim's slot goes. Pure, no I/O.

The thread pool (sdk/pool.py) and the asyncio pool (sdk/aio/pool.py) keep one ``Slots`` each
and only wait and wake their own way: the thread pool calls it under its lock, whose
``notify_all`` is the ``wake`` it gives; the asyncio pool calls it on its loop, and ``wake``
sets the event its claim loops wait on.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

import structlog

from coordinator.sdk._core.held import HeldClaim
from coordinator.sdk._core.pool import Ending, Tally
from coordinator.sdk.types import LostReason

log = structlog.get_logger(__name__)

OUTLIVED_CHECK = 1.0
"""Seconds between two looks of a running pool for handlers that outlive their lost claims."""


class PoolClaim(Protocol):
    """What the pool's accounting needs of one claim it runs: its loss, and whether the cut-off
    took it over."""

    abandoned: bool

    @property
    def claim(self) -> HeldClaim | None:
        """The claim it runs (None while a successor is being won)."""
        ...

    def lost(self, reason: LostReason) -> None:
        """The claim's on_lost: stop its handler."""
        ...


class Won(Protocol):
    """A claim one ClaimNext won, as the loss routing reads it."""

    @property
    def task_id(self) -> str:
        """The task it holds."""
        ...


RunningT = TypeVar("RunningT", bound=PoolClaim)
ClaimT = TypeVar("ClaimT", bound=Won)


class HandOver(enum.Enum):
    """Where the slot of a claim that settled went."""

    KEPT = "kept"  # its commit won the slot's next claim, which runs in it now
    FREED = "freed"  # free again: the claim loops were woken
    TAKEN = "taken"  # the cut-off had taken the claim over, and counts its ending


class Slots(Generic[RunningT]):
    """A pool's ``free`` slots, the claims running in the others, and how its claims ended
    (``tally``). Not thread-safe (see the module doc)."""

    def __init__(self, free: int, claim_batch: int, wake: Callable[[], None]) -> None:
        self.free = free
        self.tally = Tally()
        self._claim_batch = claim_batch
        self._wake = wake
        self._running: set[RunningT] = set()
        self._total = free
        # Running claims seen lost, and when; those reported outliving it; all slots held so.
        self._lost_at: dict[RunningT, float] = {}
        self._outlived: set[RunningT] = set()
        self._all_held = False

    def held(self) -> int:
        """How many claims run now."""
        return len(self._running)

    def running(self) -> list[RunningT]:
        """The claims running now."""
        return list(self._running)

    def full(self, stopping: bool) -> bool:
        """Whether a claim loop must wait for a slot (none free, and the pool still runs)."""
        return self.free == 0 and not stopping

    def take(self, stopping: bool) -> int:
        """Take a free slot and up to ``claim_batch`` - 1 more free now, for one ClaimNext; 0
        once stopping (call it when not ``full``)."""
        if stopping:
            return 0
        taken = min(self.free, self._claim_batch)
        self.free -= taken
        return taken

    def give(self, count: int = 1) -> None:
        """``count`` slots are free again (a poll that won fewer tasks than it took slots)."""
        if count > 0:
            self.free += count
            self._wake()

    def polled(self, taken: int, got: Sequence[object] | str) -> None:
        """One ClaimNext for ``taken`` slots answered ``got`` (the claims it won, or why none):
        the slots it did not fill are free again."""
        self.give(taken if isinstance(got, str) else taken - len(got))

    def start(self, running: RunningT, stopping: bool) -> bool:
        """Run ``running`` in its slot; False once stopping: it was claimed as the pool stopped,
        and must be given back, never run."""
        if stopping:
            return False
        self._running.add(running)
        return True

    def hand_over(
        self, running: RunningT, ending: Ending, successor: RunningT | None, stopping: bool
    ) -> HandOver:
        """Count how ``running`` ended and pass its slot on: to ``successor`` (the claim its
        commit won) while the pool runs, else back to the claim loops. A successor not KEPT is
        the shell's to give back."""
        if running not in self._running:
            return HandOver.TAKEN
        self._forget(running)
        self.tally.count(ending)
        if successor is not None and not stopping:
            self._running.add(successor)
            return HandOver.KEPT
        self.give()
        return HandOver.FREED

    def outlived(self, now: float, after: float) -> bool | None:
        """Look for handlers still running ``after`` seconds (the grace) past their claim's
        loss: each is logged once, its slot stays taken (a thread cannot be killed). True when
        they now hold every slot (the pool claims nothing more: set it unready), False when
        that is over, None when neither changed. A handler must return once its claim is
        lost; one that never did held its slot for good, the pool ready and silent."""
        for running in self._running:
            claim = running.claim
            if claim is None or not claim.is_lost():
                continue
            since = self._lost_at.setdefault(running, now)
            if now - since >= after and running not in self._outlived:
                self._outlived.add(running)
                log.warning(OUTLIVED, task_id=claim.task_id, seconds=round(now - since, 1))
        held = len(self._outlived) >= self._total
        if held == self._all_held:
            return None
        self._all_held = held
        (log.error if held else log.info)(ALL_HELD if held else NOT_ALL_HELD, slots=self._total)
        return held

    def _forget(self, running: RunningT) -> None:
        self._running.discard(running)
        self._lost_at.pop(running, None)
        self._outlived.discard(running)

    def abandon(self) -> list[RunningT]:
        """The claims still running when the grace ran out, now the cut-off's: their slots are
        never handed over, and a handler's late answer is dropped (``abandoned``)."""
        left_over = list(self._running)
        for running in left_over:
            running.abandoned = True
            self._forget(running)
        return left_over


OUTLIVED = "handler still running past its lost claim's grace: its slot stays taken"
ALL_HELD = (
    "every slot is held by a handler that outlived its lost claim: the pool claims nothing "
    "more (readiness off); a handler must return once its claim is lost; restart the process"
)
NOT_ALL_HELD = "a slot is free again: the pool claims (readiness on)"


class Routes(Generic[RunningT, ClaimT]):
    """The claims one ClaimNext wins, each routed its own loss: the call's ``lost`` is every
    claim's on_lost, and reaches the handler of the claim that was lost."""

    def __init__(self) -> None:
        self._by_task: dict[str, RunningT] = {}

    def won(self, claims: Sequence[ClaimT], run: Callable[[ClaimT], RunningT]) -> list[RunningT]:
        """A running claim per claim won (``run`` makes it); losses reach it from now on."""
        runnings = [run(claim) for claim in claims]
        self._by_task.update((c.task_id, r) for c, r in zip(claims, runnings, strict=True))
        return runnings

    def lost(self, reason: LostReason) -> None:
        """The on_lost of the ClaimNext's claims: tell the one that was lost."""
        running = self._by_task.get(reason.task_id)
        if running is not None:
            running.lost(reason)
