"""The promoter: moves DELAYED tasks to READY when their time comes.

A DELAYED task (waiting out a retry backoff or its not_before) has a key in the delayed index,
``{p}/delayed/{due_ms:015d}/{task_id}``, so the keys due now are one range from the start of the
index to now: a pass reads only what is due (O(due)), never the tasks that are not, and never
every task. Each promotion is a CAS on the task as read (still DELAYED, its time come), so every
replica runs this loop at once and a due task moves exactly once: the losers' compares fail and
they write nothing.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import structlog

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Op, TaskState
from coordinator.logging import Throttle
from coordinator.store.context import StoreContext
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.lifecycle.deadlines import Deadlines
from coordinator.store.lifecycle.due_index import due_pass
from coordinator.store.transition import transition, transition_ops

log = structlog.get_logger(__name__)

PROMOTER = "coordinator:promoter"

# Due keys read per range, and task records per read txn (etcd: at most 128 ops per txn).
_PAGE = 64


FAILED_EVERY = 10.0
"""Seconds between two logged failures of one kind of due-work pass (the others are counted)."""


class Promoter:
    """A thread that promotes due DELAYED tasks (and times out tasks past their deadline) every
    ``interval`` seconds."""

    def __init__(
        self, ctx: StoreContext, ready: ReadyIndex, deadlines: Deadlines, *, interval: float
    ) -> None:
        self._ctx = ctx
        self._ready = ready
        self._deadlines = deadlines
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # An etcd outage failed both passes every interval (a quarter second): about 470
        # warnings a replica in 10 s. One line per kind of pass per FAILED_EVERY seconds,
        # carrying how many it held back.
        self._failed: defaultdict[str, Throttle] = defaultdict(lambda: Throttle(FAILED_EVERY))

    def start(self) -> None:
        """Start the loop."""
        self._thread = threading.Thread(target=self._loop, name="promoter", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def promote_due(self) -> int:
        """One pass: promote every task due now; returns how many this replica moved."""
        ctx, keys = self._ctx, self._ctx.keys
        now = ctx.clock.now()
        start, end = keys.delayed_prefix, keys.delayed_due_end(now)
        return due_pass(ctx, start, end, lambda tasks: self._promote(tasks, now), page=_PAGE)

    def _promote(self, tasks: list[TaskRecord], now: float) -> int:
        ctx, keys = self._ctx, self._ctx.keys
        moved = 0
        for task in tasks:
            if task.state is not TaskState.DELAYED or task.not_before > now:
                continue  # a stale key (doctor's) or not quite due: the next pass
            after = transition(task, Op.PROMOTE, now)
            compares, ops = transition_ops(ctx, task, after, Op.PROMOTE, by=PROMOTER)
            if not ctx.kv.txn(compares, ops).succeeded:
                continue  # another replica promoted it, or the task moved on
            self._ready.add(keys.ready(after.queue, after.priority, after.ready_seq, after.task_id))
            self._ctx.metrics.promoted.inc()
            moved += 1
        return moved

    def _loop(self) -> None:
        # The same thread times out tasks past their deadline (store/lifecycle/deadlines.py): both
        # are "a range of an index sorted by time, up to now", read at the same cadence.
        while not self._stop.wait(self._interval):
            if not self._ctx.admitted():  # refused by the version record: no writes from here
                continue
            for work in (self._deadlines.time_out_due, self.promote_due):
                try:
                    work()
                except Exception as exc:  # etcd away: the next pass tries again
                    held_back = self._failed[work.__name__].admit()
                    if held_back is not None:
                        log.warning(
                            "due-work pass failed",
                            work=work.__name__,
                            error=str(exc),
                            held_back=held_back,
                        )
