"""Per-queue figures for autoscaling (ready, oldest ready age, claimed) and for operators
(blocked and overdue WAITING tasks), ranked and capped.

Pure: the store hands in what its watch-fed indexes know (coordinator.store.indexes.ready and
.claimed) and the time; this decides which queues are reported. Every replica follows the
same keys, so every replica reports the same queues with the same counts.

Only queues with work (a ready, claimed, blocked or overdue task) are reported: a queue nobody
uses costs no
series, and a replica that just started reports the same set as one that ran for weeks. At most
``cap`` are reported, the busiest first (ready + claimed, then name, so the choice is the same
on every replica); the number left out is reported too, so an operator sees the cap bite
instead of a silent zero (a left-out queue looks empty to an autoscaler).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MAX_REPORTED_QUEUES = 200
"""The default cap on queues reported per scrape (each costs three series)."""


@dataclass(frozen=True)
class ReadyHead:
    """What the ready index knows of one queue: how many ready keys, and when the
    longest-waiting of them became READY (store clock seconds, from its ready sequence)."""

    count: int
    oldest_ready_at: float


@dataclass(frozen=True)
class QueueStats:
    """One queue now: ready tasks, seconds the oldest ready one has waited, claimed tasks,
    and WAITING tasks blocked by a FAILED or CANCELLED upstream or past their deadline."""

    queue: str
    ready: int
    oldest_ready_age: float
    claimed: int
    blocked: int = 0
    overdue: int = 0


@dataclass(frozen=True)
class QueueReport:
    """The queues reported (busiest first) and how many queues with work were left out."""

    queues: tuple[QueueStats, ...]
    left_out: int


def queue_report(
    ready: Mapping[str, ReadyHead],
    claimed: Mapping[str, int],
    now: float,
    *,
    cap: int = MAX_REPORTED_QUEUES,
    blocked: Mapping[str, int] | None = None,
    overdue: Mapping[str, int] | None = None,
) -> QueueReport:
    """The report from ``ready`` (the ready index's queues), ``claimed``, ``blocked`` and
    ``overdue`` (queue -> tasks) at ``now``. An age is never negative: the time came
    from some replica's clock, which may be a little ahead of this one's."""
    blocked, overdue = blocked or {}, overdue or {}
    stats = []
    for queue in ready.keys() | claimed.keys() | blocked.keys() | overdue.keys():
        head = ready.get(queue, _NONE_READY)
        count, taken = head.count, claimed.get(queue, 0)
        stuck, late = blocked.get(queue, 0), overdue.get(queue, 0)
        if count or taken or stuck or late:
            age = max(0.0, now - head.oldest_ready_at) if count else 0.0
            stats.append(QueueStats(queue, count, age, taken, stuck, late))
    stats.sort(key=lambda s: (-(s.ready + s.claimed), s.queue))
    return QueueReport(tuple(stats[:cap]), max(0, len(stats) - cap))


_NONE_READY = ReadyHead(0, 0.0)
