"""Where an event sits in the log: one position per event, totally ordered.

An etcd revision does not name one event. Group commit (store/etcd/group_commit.py) nests several
transition txns in one etcd txn, and the releaser moves several tasks in one txn, so several
events share a revision. A reader that remembers only the revision it reached, and skips
everything at or below it, loses the rest of that revision. The position adds what names the
event's key (the task and its state_version before the transition: the key is
``{p}/events/{task_id}/{prev_state_version}``), so it identifies exactly one event, and orders
the events of one revision the same way for every reader: a history read, a watch, a resume.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.errors import InvalidArgument, ResourceExhausted

# Sorts before every real event of a revision: real task ids are never empty and real
# state_versions are never negative.
_BEFORE_TASK = ""
_BEFORE_VERSION = -1


@dataclass(frozen=True, order=True)
class EventPosition:
    """One event's place in the log: ordered by revision, then task id, then state_version."""

    revision: int
    task_id: str = _BEFORE_TASK
    prev_state_version: int = _BEFORE_VERSION

    @classmethod
    def start_of(cls, revision: int) -> EventPosition:
        """Just before the first event of ``revision``: resuming after it replays the whole
        revision (what ``from_revision`` means)."""
        return cls(revision)

    @classmethod
    def end_of(cls, revision: int) -> EventPosition:
        """Just after the last event of ``revision``: resuming after it starts at the next."""
        return cls(revision + 1)

    @property
    def is_event(self) -> bool:
        """Whether this names a real event (not a revision boundary)."""
        return bool(self.task_id) and self.prev_state_version >= 0

    @property
    def is_boundary(self) -> bool:
        """Whether this is the start of a revision (``start_of``; ``end_of`` is the start of
        the next): where a reader stands before it received any event, or past a stretch of
        the log it read from the keys."""
        return not self.task_id and self.prev_state_version == _BEFORE_VERSION

    def __str__(self) -> str:
        return f"{self.revision}/{self.task_id}/{self.prev_state_version}"


def resume_point(*, from_revision: int, after: EventPosition | None) -> EventPosition:
    """The position a reader continues after: ``after`` (the last event it received, or a
    resume position the server handed it), or the start of ``from_revision`` (0 or 1: the
    whole log). Both at once is ambiguous.

    A follower ended for falling behind is told where to resume, and that can be a boundary
    (it had received nothing yet, or had just read past compacted history), so a boundary is
    accepted as well as an event. A half-filled position - a revision alone, as a client that
    means "after this revision" would send it, which would repeat that revision - is refused:
    say from_revision for that."""
    if from_revision < 0:
        raise InvalidArgument(f"from_revision must be >= 0, got {from_revision}")
    if after is None:
        return EventPosition.start_of(max(from_revision, 1))
    if from_revision:
        raise InvalidArgument(
            "give either from_revision or after, not both: after (the position of the last "
            "event received) is how a broken stream resumes"
        )
    if after.revision <= 0 or not (after.is_event or after.is_boundary):
        raise InvalidArgument(
            "after must be the position of an event received (revision > 0, task_id set, "
            "prev_state_version >= 0) or a resume position the server sent (task_id empty, "
            f"prev_state_version -1), got {after}"
        )
    return after


class StreamBehind(ResourceExhausted):
    """A follower read its stream too slowly and fell too far behind; it may resume after
    ``position`` (every matching event up to there was sent). It lives beside the position it
    carries, so the exception root (coordinator/errors.py) imports nothing of the domain."""

    def __init__(self, position: EventPosition, buffered: int) -> None:
        super().__init__(
            f"the stream fell {buffered} events behind and was ended; resume with "
            f"after = {{revision: {position.revision}, task_id: {position.task_id!r}, "
            f"prev_state_version: {position.prev_state_version}}} (or the position of the "
            "last event you received) and read faster, or filter more narrowly"
        )
        self.position = position
