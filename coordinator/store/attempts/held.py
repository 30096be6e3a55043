"""The records this replica's claim txns wrote, so the holder's commit can skip its read.

A commit reads the task, the attempt, the live claim, the epoch and the task's result keys,
decides, then writes behind compares. When this replica granted the claim, it knows what the
claim txn wrote: the commit decides on those records and its txn additionally compares the task
and attempt keys' mod_revision with the claim generation (the claim txn's revision). The write
therefore lands only if those records are still exactly what was remembered; if anything moved
(a renewal elsewhere cannot move them, a cancel, an input change or a takeover does), the txn
fails and the commit takes the ordinary path: read, decide, write (and, if that txn fails, read
once more to name why). A remembered view can only save a read, never make a stale decision
stick: a refusal decided on it is not final either, a read decides it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from coordinator.domain.decisions import Fence, FenceView

CAPACITY = 4096
"""Views remembered at most (the oldest go first)."""
INPUT_BUDGET = 16 << 20
"""Task input bytes held in remembered views at most (inputs may be 256 KiB each)."""


class HeldClaims:
    """FenceViews of claims granted here, by fence, until their commit or release."""

    def __init__(self, capacity: int = CAPACITY, input_budget: int = INPUT_BUDGET) -> None:
        self._capacity = capacity
        self._budget = input_budget
        self._lock = threading.Lock()
        self._views: OrderedDict[tuple[str, str, int], FenceView] = OrderedDict()
        self._bytes = 0

    def remember(self, fence: Fence, view: FenceView) -> None:
        """The view the claim txn behind ``fence`` wrote."""
        with self._lock:
            self._views[_key(fence)] = view
            self._bytes += len(view.task.input)
            while len(self._views) > self._capacity or self._bytes > self._budget:
                _, oldest = self._views.popitem(last=False)
                self._bytes -= len(oldest.task.input)

    def peek(self, fence: Fence) -> FenceView | None:
        """The remembered view of ``fence``, kept for its commit (a renewal reads it to skip
        its own first read; its txn compares what it decides on)."""
        with self._lock:
            return self._views.get(_key(fence))

    def take(self, fence: Fence) -> FenceView | None:
        """The remembered view of ``fence`` (forgotten: a second use would be a retry, and a
        retry must read what happened)."""
        with self._lock:
            view = self._views.pop(_key(fence), None)
            if view is not None:
                self._bytes -= len(view.task.input)
            return view

    def __len__(self) -> int:
        with self._lock:
            return len(self._views)


def _key(fence: Fence) -> tuple[str, str, int]:
    return fence.task_id, fence.attempt_id, fence.claim_generation
