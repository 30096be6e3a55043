"""Where an attempt resumes from: the checkpoint one attempt hands the next.

An attempt's checkpoint (RenewRequest.checkpoint) is kept with its attempt record; a new attempt
of the same task revision starts from the previous attempt's, and keeps it until it writes its
own, so an attempt that never checkpoints does not lose it. A new revision (a new input, a
rejected review) is new work: a checkpoint of another revision is no place to resume from.
"""

from __future__ import annotations

from coordinator.domain.records import AttemptRecord, TaskRecord


def resumable_checkpoint(task: TaskRecord, latest: AttemptRecord | None) -> bytes:
    """The checkpoint the next attempt of ``task`` starts from, given its ``latest`` attempt
    (None: it has none): that attempt's, if it ran on the task's current revision."""
    if latest is None or latest.revision != task.revision:
        return b""
    return latest.checkpoint
