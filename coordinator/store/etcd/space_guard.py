"""The space guard: every txn passes it on its way to etcd (``EtcdKV``), nested or not.

The rule is domain/space.py's; this module holds the state the rule reads and applies it to a
txn request. The state comes from the db-size watch (store/etcd/db_size.py: etcd's Status and its
alarm list, every few seconds) and, sooner, from etcd itself: a NOSPACE refusal of any request
trips the guard at once, so the nested puts etcd would still accept stop with the first plain
write etcd refuses, not at the next reading.

Above the high-water mark a growth write goes only inside ``within_share()``: the door
(coordinator/server/interceptors/high_water.py) opens it around a call its caller's high-water
share admits, and the store's writes made in that call's thread see it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import structlog

from coordinator.domain.space import (
    SpaceState,
    SpaceVerdict,
    WriteKind,
    decide_write,
    refusal_message,
    retry_refusal,
)
from coordinator.errors import SpaceRefused
from coordinator.metrics import METRICS, Metrics
from coordinator.store.etcd.ops import op_kinds

log = structlog.get_logger(__name__)

DEFAULT_RETRY_AFTER = 5.0
"""Seconds a refused caller is told to wait: the db-size watch's default interval, the soonest
the state can change."""

# Above the full mark growth is refused as above high water (1), shares included.
_GAUGE = {SpaceState.CLEAR: 0, SpaceState.HIGH_WATER: 1, SpaceState.FULL: 1, SpaceState.NOSPACE: 2}
_LABEL = {
    SpaceVerdict.REFUSE_HIGH_WATER: "high_water",
    SpaceVerdict.REFUSE_FULL: "full",
    SpaceVerdict.REFUSE_NOSPACE: "nospace",
}
_WITHIN_SHARE: ContextVar[bool] = ContextVar("within_share", default=False)


@contextlib.contextmanager
def within_share() -> Iterator[None]:
    """The growth writes made in this block (this thread or task) are within their caller's
    high-water share: above the high-water mark, not above the full mark, they go."""
    token = _WITHIN_SHARE.set(True)
    try:
        yield
    finally:
        _WITHIN_SHARE.reset(token)


class SpaceGuard:
    """The replica's view of etcd's space, and the gate every txn passes."""

    def __init__(
        self, *, retry_after: float = DEFAULT_RETRY_AFTER, metrics: Metrics = METRICS
    ) -> None:
        self._state = SpaceState.CLEAR
        self._retry_after = retry_after
        self._metrics = metrics
        self._lock = threading.Lock()

    @property
    def state(self) -> SpaceState:
        """The state last observed."""
        return self._state

    def observe(self, state: SpaceState) -> None:
        """Take a new reading (the db-size watch's, or etcd's own NOSPACE refusal)."""
        with self._lock:
            before, self._state = self._state, state
        self._metrics.space_state.set(_GAUGE[state])
        if state is not before:
            log.warning(
                "space guard state changed",
                before=before.value,
                after=state.value,
                hint="above high water only claims (of tasks with few attempts), renewals, "
                "commits, releases, prunes and growth within each caller's high-water share "
                "write; above the full mark no "
                "growth; at NOSPACE compact, defragment and disarm etcd (docs/retention.md)",
            )

    def admit_txn(self, request: Any) -> None:
        """Raise SpaceRefused if ``request`` (a TxnRequest, whatever it nests) may not go to
        etcd now: at NOSPACE, when it puts anything."""
        if self._state is not SpaceState.NOSPACE:  # the hot path: no walk over the request
            return
        self.admit(WriteKind.DRAIN, puts=puts_anywhere(request))

    def admit(self, kind: WriteKind, *, puts: bool = True) -> None:
        """Raise SpaceRefused if a write of ``kind`` (``puts``: it puts a key) may not go to
        etcd now."""
        state = self._state
        if state is SpaceState.CLEAR:
            return
        verdict = decide_write(kind, state, puts=puts, within_share=_WITHIN_SHARE.get())
        if verdict is not SpaceVerdict.ALLOW:
            raise self._refusal(verdict)

    def growth_refusal(self) -> str:
        """Why a write that only adds data may not go to etcd now, "" if it may: for the data a
        call carries beside what it must do (a renewal's checkpoint, a failure's details),
        which is left out instead of refusing the call."""
        try:
            self.admit(WriteKind.GROWTH)
        except SpaceRefused as exc:
            return str(exc)
        return ""

    def retry_refusal(self, attempts: int) -> str:
        """Why a claim that would start attempt ``attempts + 1`` of a task may not go now, ""
        if it may (domain/space.py ``retry_refusal``); a refusal is counted as ``retry``."""
        why = retry_refusal(self._state, attempts, retry_after=self._retry_after)
        if why:
            self._metrics.space_refusals.labels("retry").inc()
        return why

    def tripped(self) -> SpaceRefused:
        """etcd itself refused a write for NOSPACE: the state from now on, and the refusal
        to raise in place of etcd's error."""
        self.observe(SpaceState.NOSPACE)
        return self._refusal(SpaceVerdict.REFUSE_NOSPACE)

    def _refusal(self, verdict: SpaceVerdict) -> SpaceRefused:
        self._metrics.space_refusals.labels(_LABEL[verdict]).inc()
        return SpaceRefused(refusal_message(verdict, retry_after=self._retry_after))


def puts_anywhere(request: Any) -> bool:
    """Whether a TxnRequest puts a key in either branch, at any depth of nesting (what etcd's
    quota check, ``costTxnReq``, does not look at)."""
    return "request_put" in op_kinds(request)
