"""Which dead letters a bulk RetryTasks sends back, and how far one call goes (pure, no I/O).

After a bad deploy a queue's FAILED tasks are retried together: those of one queue, optionally
only those whose latest attempt failed with one error code, or that failed since some time.
One call is bounded twice: it scans at most ``MAX_SCAN`` task records (a filter that matches
little must not read the whole keyspace in one call) and retries at most its limit; its page
token is the last task id it read, so the next call resumes after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState

MAX_SCAN = 5000
"""Task records one RetryTasks call reads at most, matching or not."""
MAX_LIMIT = 1000
"""Tasks one RetryTasks call retries at most."""
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class DeadLetterFilter:
    """The FAILED tasks of ``queue`` a bulk retry picks: with ``error_code`` only those whose
    latest attempt failed with it, with ``failed_since`` (> 0) only those that failed at or
    after it (a FAILED task's updated_at is when it failed: nothing else moves it)."""

    queue: str
    error_code: str = ""
    failed_since: float = 0.0

    def matches(self, task: TaskRecord) -> bool:
        """Whether ``task`` is one of the dead letters this filter picks."""
        return (
            task.state is TaskState.FAILED
            and task.queue == self.queue
            and (not self.error_code or task.last_error_code == self.error_code)
            and task.updated_at >= self.failed_since
        )


@dataclass(frozen=True)
class Skipped:
    """A matching task one call did not retry, and why (it changed, or RetryTask refused it)."""

    task_id: str
    reason: str


@dataclass(frozen=True)
class BulkRetryPage:
    """What one RetryTasks call did: the ids it retried (dry run: would retry), the matching
    ones it skipped, the token the next call resumes from ("" at the end) and the records
    it read."""

    retried: tuple[str, ...]
    skipped: tuple[Skipped, ...]
    next_page_token: str
    scanned: int
